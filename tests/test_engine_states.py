"""The engine connection's transition table: each row, the pairs it lacks, where sequences go."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import IllegalTransitionError
from sidecar.edge.engine.states import TRANSITIONS, EngineEvent, Phase, next_phase

E, P = EngineEvent, Phase

ROWS = [
    pytest.param(P.IDLE, E.SEND, P.SENT, id="idle-send"),
    pytest.param(P.IDLE, E.FAIL, P.BROKEN, id="idle-closed-by-engine"),
    pytest.param(P.SENT, E.FIRST_BYTE, P.HEAD, id="sent-first-byte"),
    pytest.param(P.SENT, E.FAIL, P.BROKEN, id="sent-stale"),
    pytest.param(P.HEAD, E.HEAD, P.BODY, id="head-read"),
    pytest.param(P.HEAD, E.HEAD_ONLY, P.COMPLETE, id="head-request-answered"),
    pytest.param(P.HEAD, E.LAST_END, P.SPENT, id="head-request-answered-with-close"),
    pytest.param(P.HEAD, E.FAIL, P.BROKEN, id="head-broken"),
    pytest.param(P.BODY, E.BODY_END, P.COMPLETE, id="body-framed-end"),
    pytest.param(P.BODY, E.LAST_END, P.SPENT, id="body-framed-end-with-close"),
    pytest.param(P.BODY, E.CLOSED_AT_END, P.SPENT, id="body-close-delimited-end"),
    pytest.param(P.BODY, E.FAIL, P.BROKEN, id="body-cut-off"),
    pytest.param(P.COMPLETE, E.PARK, P.IDLE, id="complete-parked"),
    pytest.param(P.COMPLETE, E.FAIL, P.BROKEN, id="complete-bytes-after"),
    pytest.param(P.SPENT, E.FAIL, P.BROKEN, id="spent-bytes-after"),
]


@pytest.mark.parametrize(("phase", "event", "expected"), ROWS)
def test_each_row_moves_to_its_phase(phase: Phase, event: EngineEvent, expected: Phase) -> None:
    """Every allowed (phase, event) pair lands where the connection's life says."""
    assert next_phase(phase, event) is expected


def test_the_rows_above_are_the_whole_table() -> None:
    """No row of the table goes untested, and none tested is missing from it."""
    assert {(row.values[0], row.values[1]) for row in ROWS} == set(TRANSITIONS)


ILLEGAL = [(p, e) for p in Phase for e in EngineEvent if (p, e) not in TRANSITIONS]


@pytest.mark.parametrize(
    ("phase", "event"), ILLEGAL, ids=[f"{p.value}-{e.value}" for p, e in ILLEGAL]
)
def test_a_pair_the_table_lacks_raises(phase: Phase, event: EngineEvent) -> None:
    """A move the table does not allow is a bug, raised, never a silent state."""
    with pytest.raises(IllegalTransitionError) as caught:
        next_phase(phase, event)
    assert (caught.value.state, caught.value.event) == (phase, event)


def test_a_broken_connection_never_moves_again() -> None:
    """BROKEN is the end: no event leads out of it (the pool never reuses it)."""
    assert [e for e in EngineEvent if (P.BROKEN, e) in TRANSITIONS] == []


def test_every_phase_is_reachable_and_every_live_one_can_return_to_the_pool() -> None:
    """From IDLE every phase can be reached, and from every phase but BROKEN and SPENT (an
    answer after which the engine closes), IDLE again."""

    def reach(start: Phase) -> set[Phase]:
        seen, todo = {start}, [start]
        while todo:
            here = todo.pop()
            for (phase, _event), there in TRANSITIONS.items():
                if phase is here and there not in seen:
                    seen.add(there)
                    todo.append(there)
        return seen

    assert reach(P.IDLE) == set(Phase)
    assert [p for p in Phase if P.IDLE not in reach(p)] == [P.SPENT, P.BROKEN]


@given(st.lists(st.sampled_from(EngineEvent), max_size=40))
def test_no_event_sequence_reuses_a_busy_or_broken_connection(events: list[EngineEvent]) -> None:
    """Whatever events come, illegal ones refused and leaving the phase where it was: a request
    is only ever written on an idle connection, and a broken one never comes back."""
    phase, broken = P.IDLE, False
    for event in events:
        before = phase
        try:
            phase = next_phase(phase, event)
        except IllegalTransitionError:
            assert (phase, event) not in TRANSITIONS
            continue
        assert phase in Phase
        if event is E.SEND:
            assert before is P.IDLE
        broken = broken or phase is P.BROKEN
        assert phase is P.BROKEN or not broken


def test_only_an_answer_the_engine_keeps_returns_to_the_pool() -> None:
    """Reuse is read from the phase: the one way back to IDLE is parking a COMPLETE answer."""
    into_idle = [pair for pair, there in TRANSITIONS.items() if there is P.IDLE]
    assert into_idle == [(P.COMPLETE, E.PARK)]
