"""The client connection's transition table: each row, the pairs it lacks, where sequences go."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import IllegalTransitionError
from sidecar.edge.http.states import READING, TRANSITIONS, Event, State, next_state

E, S = Event, State
CLOSED_OR_CLOSING = (S.CLOSING, S.LINGERING, S.REFUSED, S.CLOSED)

ROWS = [
    pytest.param(S.IDLE, E.START, S.ACTIVE, id="idle-start"),
    pytest.param(S.LAST, E.START, S.LAST, id="queued-behind-broken-framing-starts-last"),
    pytest.param(S.ACTIVE, E.NO_KEEP_ALIVE, S.CLOSE_AFTER, id="client-asked-to-close"),
    pytest.param(S.IDLE, E.FINAL, S.LAST, id="idle-broken-framing-with-one-queued"),
    pytest.param(S.ACTIVE, E.FINAL, S.LAST, id="active-upgrade-or-broken-framing"),
    pytest.param(S.CLOSE_AFTER, E.FINAL, S.LAST, id="closing-after-broken-framing"),
    pytest.param(S.LAST, E.FINAL, S.LAST, id="last-stays-last"),
    pytest.param(S.ACTIVE, E.KEEP, S.IDLE, id="answered-and-kept"),
    pytest.param(S.IDLE, E.CLOSE, S.CLOSING, id="idle-closed"),
    pytest.param(S.ACTIVE, E.CLOSE, S.CLOSING, id="active-answer-closes"),
    pytest.param(S.CLOSE_AFTER, E.CLOSE, S.CLOSING, id="close-after-answer-out"),
    pytest.param(S.LAST, E.CLOSE, S.CLOSING, id="last-answer-out"),
    pytest.param(S.CLOSING, E.CLOSE, S.CLOSING, id="closing-again"),
    pytest.param(S.LINGERING, E.CLOSE, S.CLOSING, id="lingering-closed"),
    pytest.param(S.IDLE, E.LINGER, S.LINGERING, id="bad-head-answered-read-off"),
    pytest.param(S.ACTIVE, E.LINGER, S.LINGERING, id="body-unread-read-off"),
    pytest.param(S.CLOSE_AFTER, E.LINGER, S.LINGERING, id="close-after-body-unread"),
    pytest.param(S.LAST, E.LINGER, S.LINGERING, id="last-with-bytes-unread"),
    pytest.param(S.IDLE, E.REFUSE, S.REFUSED, id="partial-head-evicted"),
    pytest.param(S.CLOSING, E.REFUSE, S.REFUSED, id="closing-head-evicted"),
    pytest.param(S.LINGERING, E.REFUSE, S.REFUSED, id="lingering-head-evicted"),
    pytest.param(S.IDLE, E.LOST, S.CLOSED, id="idle-lost"),
    pytest.param(S.ACTIVE, E.LOST, S.CLOSED, id="active-lost"),
    pytest.param(S.CLOSE_AFTER, E.LOST, S.CLOSED, id="close-after-lost"),
    pytest.param(S.LAST, E.LOST, S.CLOSED, id="last-lost"),
    pytest.param(S.CLOSING, E.LOST, S.CLOSED, id="closing-lost"),
    pytest.param(S.LINGERING, E.LOST, S.CLOSED, id="lingering-lost"),
    pytest.param(S.REFUSED, E.LOST, S.CLOSED, id="refused-lost"),
]


@pytest.mark.parametrize(("state", "event", "expected"), ROWS)
def test_each_row_moves_to_its_state(state: State, event: Event, expected: State) -> None:
    """Every allowed (state, event) pair lands where the connection's life says."""
    assert next_state(state, event) is expected


def test_the_rows_above_are_the_whole_table() -> None:
    """No row of the table goes untested, and none tested is missing from it."""
    assert {(row.values[0], row.values[1]) for row in ROWS} == set(TRANSITIONS)


ILLEGAL = [(s, e) for s in State for e in Event if (s, e) not in TRANSITIONS]


@pytest.mark.parametrize(
    ("state", "event"), ILLEGAL, ids=[f"{s.value}-{e.value}" for s, e in ILLEGAL]
)
def test_a_pair_the_table_lacks_raises(state: State, event: Event) -> None:
    """A move the table does not allow is a bug, raised, never a silent state."""
    with pytest.raises(IllegalTransitionError) as caught:
        next_state(state, event)
    assert (caught.value.state, caught.value.event) == (state, event)


def test_a_closed_connection_never_moves_again() -> None:
    """CLOSED is the end: no event leads out of it."""
    assert [e for e in Event if (S.CLOSED, e) in TRANSITIONS] == []


def test_only_a_kept_answer_reopens_a_connection_for_requests() -> None:
    """The one way back to IDLE is an answer kept; closing never leads back to reading."""
    into_idle = [pair for pair, there in TRANSITIONS.items() if there is S.IDLE]
    assert into_idle == [(S.ACTIVE, E.KEEP)]
    assert [s for s in CLOSED_OR_CLOSING if s in READING] == []


@given(st.lists(st.sampled_from(Event), max_size=40))
def test_no_event_sequence_reads_again_after_closing(events: list[Event]) -> None:
    """Whatever events come, illegal ones refused and leaving the state where it was: once
    closing, a connection is never read from or kept again, and every one can still be lost."""
    state, closing = S.IDLE, False
    for event in events:
        try:
            state = next_state(state, event)
        except IllegalTransitionError:
            assert (state, event) not in TRANSITIONS
            continue
        closing = closing or state in CLOSED_OR_CLOSING
        assert not (closing and state in READING)
    assert state is S.CLOSED or next_state(state, E.LOST) is S.CLOSED


def test_only_an_active_connection_is_kept() -> None:
    """Keep-alive is read from the state: no row from a state that closes leads to ACTIVE, and
    an answer that may not be followed by another leaves ACTIVE for good."""
    into_active = [pair for pair, there in TRANSITIONS.items() if there is S.ACTIVE]
    assert into_active == [(S.IDLE, E.START)]
    assert next_state(S.ACTIVE, E.NO_KEEP_ALIVE) is not S.ACTIVE
