"""The grant order by source: the waiter whose source holds fewest places first, oldest first
among equals, through the admission core and against a brute-force model of it."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sidecar.core.admission.compartments import DEFAULT, parse_compartments
from sidecar.core.admission.decisions import Granted, Queued
from sidecar.core.admission.fair_queue import FairQueue, Waiter
from sidecar.core.admission.machine import Admission


def _granted(decision: object) -> int:
    assert isinstance(decision, Granted), decision
    return decision.ticket


def _queued(decision: object) -> Queued:
    assert isinstance(decision, Queued), decision
    return decision


def test_a_source_holding_nothing_goes_before_one_holding_many() -> None:
    """Both places held by one source and three of its requests waiting: a request from another
    source is the next let in, with nobody ahead of it (the attack of issue 48, rows 2-3)."""
    core = Admission(limit=2, max_queue=8)
    held = [_granted(core.request(1, DEFAULT, source="heavy")) for _ in range(2)]
    heavy = [_queued(core.request(1, DEFAULT, source="heavy")) for _ in range(3)]
    light = _queued(core.request(1, DEFAULT, source="light"))
    assert [q.ahead for q in heavy] == [0, 1, 2]
    assert light.ahead == 0
    assert core.release(held[0], "completed") == (Granted(light.ticket, DEFAULT, 1),)
    assert core.release(held[1], "completed") == (Granted(heavy[0].ticket, DEFAULT, 1),)


def test_equals_go_oldest_first() -> None:
    """Two sources holding nothing, each with two waiters (a a b b): a, b, a, b, each the
    oldest among those whose source holds fewest places; each queued with those ranked before
    it then ahead of it."""
    core = Admission(limit=3, max_queue=8)
    held = [_granted(core.request(1, DEFAULT, source="x")) for _ in range(3)]
    a1, a2, b1, b2 = (_queued(core.request(1, DEFAULT, source=s)) for s in "aabb")
    assert [q.ahead for q in (a1, a2, b1, b2)] == [0, 1, 1, 3]
    assert core.grant_order() == (a1.ticket, b1.ticket, a2.ticket, b2.ticket)
    woken = [g.ticket for ticket in held for g in core.release(ticket, "completed")]
    assert woken == [a1.ticket, b1.ticket, a2.ticket]


def test_without_sources_the_queue_is_first_come_first_served() -> None:
    """No source given (one anonymous source): each waiter has those queued before it ahead
    and is let in in the order it came."""
    core = Admission(limit=1, max_queue=8)
    running = _granted(core.request(1, DEFAULT))
    waiting = [_queued(core.request(1, DEFAULT)) for _ in range(4)]
    assert [q.ahead for q in waiting] == [0, 1, 2, 3]
    assert core.grant_order() == tuple(q.ticket for q in waiting)
    assert core.queued_ahead(DEFAULT) == 4
    woken = [g.ticket for g in core.release(running, "completed")]
    for _ in range(3):
        woken += [g.ticket for g in core.release(woken[-1], "completed")]
    assert woken == [q.ticket for q in waiting]


def test_ahead_counts_those_to_be_let_in_first() -> None:
    """Behind three waiters of a source holding both places, a second source's waiters are
    ranked by its own places-to-be: 0, 1, then 3 ahead (one heavy waiter ranks equal and is
    older); a refused newcomer from a fresh source would have one ahead (the light source's
    first, equal and older), from the heavy one every waiter."""
    core = Admission(limit=2, max_queue=8)
    for _ in range(2):
        core.request(1, DEFAULT, source="heavy")
    for _ in range(3):
        core.request(1, DEFAULT, source="heavy")
    light = [_queued(core.request(1, DEFAULT, source="light")) for _ in range(3)]
    assert [q.ahead for q in light] == [0, 1, 3]
    assert core.queued_ahead(DEFAULT, "fresh") == 1
    assert core.queued_ahead(DEFAULT, "heavy") == 6


def test_a_released_place_changes_who_is_next() -> None:
    """Two sources holding one place each: the older waiter is next, until the younger's source
    gives its place back, and then the younger is let in."""
    core = Admission(limit=2, max_queue=8)
    mine, theirs = (_granted(core.request(1, DEFAULT, source=s)) for s in ("a", "b"))
    older = _queued(core.request(1, DEFAULT, source="b"))
    younger = _queued(core.request(1, DEFAULT, source="a"))
    assert core.grant_order() == (older.ticket, younger.ticket)
    assert core.release(mine, "completed") == (Granted(younger.ticket, DEFAULT, 1),)
    assert core.release(theirs, "completed") == (Granted(older.ticket, DEFAULT, 1),)


def test_a_compartments_guarantee_still_comes_first() -> None:
    """Default borrowed gold's idle half: a freed place goes to gold's waiter within its
    guarantee, not to a default waiter whose source holds nothing."""
    core = Admission(limit=4, max_queue=8, compartments=parse_compartments("gold=50%"))
    held = [_granted(core.request(1, DEFAULT, source="heavy")) for _ in range(4)]
    light = _queued(core.request(1, DEFAULT, source="light"))
    gold = _queued(core.request(1, "gold", source="g"))
    assert core.release(held[0], "completed") == (Granted(gold.ticket, "gold", 1),)
    assert core.release(held[1], "completed") == (Granted(light.ticket, DEFAULT, 1),)


def test_places_are_counted_per_compartment() -> None:
    """A source's place in another compartment does not count against its waiter in this one:
    holding nothing here, it goes before the older waiter of a source holding one here."""
    core = Admission(limit=2, max_queue=8, compartments=parse_compartments("gold=50%"))
    held = _granted(core.request(1, "gold", source="a"))
    _granted(core.request(1, DEFAULT, source="b"))
    older = _queued(core.request(1, DEFAULT, source="b"))
    younger = _queued(core.request(1, DEFAULT, source="a"))
    assert younger.ahead == 0
    assert core.grant_order() == (younger.ticket, older.ticket)
    assert core.release(held, "completed") == (Granted(younger.ticket, DEFAULT, 1),)


# --- the order against a brute-force model -------------------------------------------------------


def simulated_order(held: Counter[str | None], waiters: list[Waiter]) -> list[int]:
    """Grant one waiter at a time: the first waiter of each source, the one whose source holds
    fewest places (the oldest among equals); its source then holds one more."""
    held, left, order = Counter(held), list(waiters), []
    while left:
        firsts = {w.source: w for w in reversed(left)}.values()  # each source's oldest
        chosen = min(firsts, key=lambda w: (held[w.source], w.ticket))
        left.remove(chosen)
        held[chosen.source] += 1
        order.append(chosen.ticket)
    return order


SOURCES = st.sampled_from(["a", "b", "c", None])


@settings(max_examples=200, deadline=None)
@given(
    held=st.lists(SOURCES, max_size=8),
    sources=st.lists(SOURCES, max_size=12),
    newcomer=SOURCES,
)
def test_the_order_and_the_counts_ahead_match_one_grant_at_a_time(
    held: list[str | None], sources: list[str | None], newcomer: str | None
) -> None:
    """The queue's order, each waiter's count ahead and a newcomer's are those of granting one
    waiter at a time."""
    queue = FairQueue()
    for source in held:
        queue.hold(source)
    waiters = [Waiter(ticket, DEFAULT, 1, source) for ticket, source in enumerate(sources)]
    for waiter in waiters:
        queue.append(waiter)
    expected = simulated_order(Counter(held), waiters)
    assert [w.ticket for w in queue.order()] == expected
    if waiters:
        assert queue.head().ticket == expected[0]
    assert [queue.ahead_of(w) for w in waiters] == [expected.index(w.ticket) for w in waiters]
    late = Waiter(len(waiters), DEFAULT, 1, newcomer)
    assert queue.ahead_of_newcomer(newcomer) == simulated_order(
        Counter(held), [*waiters, late]
    ).index(late.ticket)


class SourcedAdmission(RuleBasedStateMachine):
    """Random requests from a few sources, releases and withdrawals in two compartments: each
    grant is its compartment's next by source, and the core's order is the model's."""

    def __init__(self) -> None:
        super().__init__()
        self.core = Admission(limit=4, max_queue=6, compartments=parse_compartments("a=50%"))
        self.live: dict[int, tuple[str, str | None]] = {}  # ticket -> compartment, source
        self.pending: dict[str, list[Waiter]] = {"a": [], DEFAULT: []}

    def _expected(self, name: str) -> list[int]:
        held = Counter(s for c, s in self.live.values() if c == name)
        return simulated_order(held, self.pending[name])

    def _take(self, grants: tuple[Granted, ...]) -> None:
        for grant in grants:
            assert grant.ticket == self._expected(grant.compartment)[0], "not the next by source"
            waiter = next(w for w in self.pending[grant.compartment] if w.ticket == grant.ticket)
            self.pending[grant.compartment].remove(waiter)
            self.live[grant.ticket] = (grant.compartment, waiter.source)

    @rule(name=st.sampled_from(["a", DEFAULT]), source=SOURCES, cost=st.integers(1, 2))
    def request(self, name: str, source: str | None, cost: int) -> None:
        decision = self.core.request(cost, name, source=source)
        if isinstance(decision, Granted):  # with nobody waiting, or as its compartment's next
            self.pending[name].append(Waiter(decision.ticket, name, cost, source))
            self._take((decision,))
        elif isinstance(decision, Queued):
            waiter = Waiter(decision.ticket, name, cost, source)
            self.pending[name].append(waiter)
            assert decision.ahead == self._expected(name).index(decision.ticket)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.live)))
        del self.live[ticket]
        self._take(self.core.release(ticket, "completed"))

    @precondition(lambda self: any(self.pending.values()))
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        waiters = [w for queue in self.pending.values() for w in queue]
        waiter = data.draw(st.sampled_from(waiters))
        self.pending[waiter.compartment].remove(waiter)
        withdrawal = self.core.withdraw(waiter.ticket, "timeout")
        assert withdrawal.removed
        self._take(withdrawal.granted)

    @invariant()
    def each_compartments_order_is_the_models(self) -> None:
        order = self.core.grant_order()
        for name in self.pending:
            assert [t for t in order if any(w.ticket == t for w in self.pending[name])] == (
                self._expected(name)
            )


SourcedAdmission.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
TestSourcedAdmission = SourcedAdmission.TestCase
