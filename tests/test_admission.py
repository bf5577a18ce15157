"""The admission state machine: decisions, resize, compartments, and a stateful property test."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from sidecar.core.admission.compartments import DEFAULT, Compartments, parse_compartments
from sidecar.core.admission.decisions import (
    Granted,
    Hopeless,
    Queued,
    Rejected,
    Started,
    UnknownTicketError,
)
from sidecar.core.admission.machine import Admission


class Pool:
    """A mode whose limit grows back (adaptive): only what is bigger than the pool is too large."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def ceiling(self) -> int | None:
        return self.tokens


def _ticket(decision: object) -> int:
    assert isinstance(decision, Granted | Queued), decision
    return decision.ticket


def test_grants_up_to_the_limit_then_queues_then_rejects() -> None:
    """Two permits, one queue slot: grant, grant, queue, then queue_full."""
    core = Admission(limit=2, max_queue=1)
    decisions = [core.request(1, "default") for _ in range(4)]
    kinds = [type(d).__name__ for d in decisions]
    assert kinds == ["Granted", "Granted", "Queued", "Rejected"]
    assert isinstance(decisions[3], Rejected)
    assert decisions[3].reason == "queue_full"


def test_release_wakes_the_oldest_waiter() -> None:
    """A release hands the permit to the first waiter, not the last."""
    core = Admission(limit=1, max_queue=5)
    first = _ticket(core.request(1, "default"))
    waiting = [_ticket(core.request(1, "default")) for _ in range(3)]
    woken = core.release(first, "completed")
    assert [g.ticket for g in woken] == waiting[:1]


def test_release_twice_is_refused() -> None:
    """A second release of the same grant raises instead of freeing capacity twice."""
    core = Admission(limit=1, max_queue=0)
    ticket = _ticket(core.request(1, "default"))
    core.release(ticket, "completed")
    with pytest.raises(UnknownTicketError):
        core.release(ticket, "failed")
    assert core.snapshot().released == {"completed": 1}


def test_growing_wakes_waiters_in_fifo_order() -> None:
    """Resizing from 1 to 3 grants the two oldest waiters at once, oldest first."""
    core = Admission(limit=1, max_queue=5)
    core.request(1, "default")
    waiting = [_ticket(core.request(1, "default")) for _ in range(3)]
    assert [g.ticket for g in core.resize(3)] == waiting[:2]


def test_shrinking_revokes_nothing_and_grants_nothing_until_under_the_limit() -> None:
    """Shrink 3 -> 1 with 3 running: nobody is granted until two of them have ended."""
    core = Admission(limit=3, max_queue=5)
    running = [_ticket(core.request(1, "default")) for _ in range(3)]
    assert core.resize(1) == ()
    waiter = _ticket(core.request(1, "default"))
    assert core.in_use == 3
    assert core.release(running[0], "completed") == ()
    assert core.release(running[1], "completed") == ()
    assert [g.ticket for g in core.release(running[2], "completed")] == [waiter]


@pytest.mark.parametrize(
    ("max_queue", "expected"),
    [
        pytest.param(0, "no_capacity", id="no-queue-rejects"),
        pytest.param(2, "Queued", id="queue-waits-for-growth"),
    ],
)
def test_limit_zero(max_queue: int, expected: str) -> None:
    """Limit 0 is valid: without a queue it says no_capacity, with one the caller waits."""
    decision = Admission(limit=0, max_queue=max_queue).request(1, "default")
    shown = decision.reason if isinstance(decision, Rejected) else type(decision).__name__
    assert shown == expected


def test_token_mode_rejects_a_request_larger_than_the_pool_at_once() -> None:
    """In token mode a request bigger than every byte reachable is too_large, not queued."""
    core = Admission(limit=1000, max_queue=10)
    decision = core.request(1001, "default")
    assert isinstance(decision, Rejected)
    assert decision.reason == "too_large"


def test_token_mode_small_requests_share_the_pool() -> None:
    """Short requests each pay their own cost: four of 250 fit in 1000, a fifth waits."""
    core = Admission(limit=1000, max_queue=10)
    kinds = [type(core.request(250, "default")).__name__ for _ in range(5)]
    assert kinds == ["Granted"] * 4 + ["Queued"]


def test_large_head_is_not_overtaken_by_small_ones() -> None:
    """A big waiter at the head blocks later small ones in its compartment until it fits."""
    core = Admission(limit=1000, max_queue=10)
    small = _ticket(core.request(600, "default"))
    big = _ticket(core.request(800, "default"))
    later = core.request(100, "default")
    assert isinstance(later, Queued)
    woken = core.release(small, "completed")
    assert [g.ticket for g in woken] == [big, later.ticket]


def test_borrowing_stops_behind_an_older_waiting_head() -> None:
    """A later borrower may not pass an older waiting head, so room drains back to it."""
    comps = parse_compartments("a=50%,b=50%")  # default: 0%, everything it uses is borrowed
    core = Admission(limit=10, max_queue=10, compartments=comps)
    a_running = _ticket(core.request(3, "a"))
    b_big = core.request(8, "b")  # 5 of its own + 3 borrowed: waits for a
    small = core.request(1, "default")  # would fit now, but b's request is older
    assert isinstance(b_big, Queued)
    assert isinstance(small, Queued)
    woken = core.release(a_running, "completed")
    assert [g.ticket for g in woken] == [b_big.ticket, small.ticket]


def test_compartment_at_its_cap_queues_without_touching_others_reserve() -> None:
    """Tenant a (share 20%, cap 50%) stops at 5 of 10 and queues; b's 30% stays free for b."""
    comps = parse_compartments("a=20%:50%,b=30%,default=10%")
    core = Admission(limit=10, max_queue=10, compartments=comps)
    kinds = [type(core.request(1, "a")).__name__ for _ in range(6)]
    assert kinds == ["Granted"] * 5 + ["Queued"]
    b_kinds = [type(core.request(1, "b")).__name__ for _ in range(3)]
    assert b_kinds == ["Granted"] * 3


def test_borrowed_capacity_is_given_back_to_the_owner() -> None:
    """a may borrow default's idle share; once default waits, freed room goes to default first."""
    core = Admission(limit=4, max_queue=10, compartments=parse_compartments("a=50%"))
    a_tickets = [_ticket(core.request(1, "a")) for _ in range(4)]  # 2 own + 2 borrowed
    a_more = core.request(1, "a")
    owner = core.request(1, "stranger")  # unknown key -> default, within its 50%
    assert isinstance(a_more, Queued)
    assert isinstance(owner, Queued)
    assert owner.compartment == "default"
    assert [g.ticket for g in core.release(a_tickets[0], "completed")] == [owner.ticket]
    assert [g.ticket for g in core.release(a_tickets[1], "completed")] == [a_more.ticket]


def test_owner_within_guarantee_is_not_refused_while_others_borrowed() -> None:
    """A compartment within its guarantee waits only for borrowed work to end, never times out
    behind later borrowers: no one else is granted before it."""
    core = Admission(limit=2, max_queue=10, compartments=parse_compartments("gold=50%"))
    borrowed = [_ticket(core.request(1, "default")) for _ in range(2)]
    gold = core.request(1, "gold")
    later = core.request(1, "default")
    assert isinstance(gold, Queued)
    assert [g.ticket for g in core.release(borrowed[1], "completed")] == [gold.ticket]
    assert isinstance(later, Queued)


def test_cancel_while_queued_leaves_no_trace() -> None:
    """A withdrawn waiter is gone: not counted as rejected, never granted later."""
    core = Admission(limit=1, max_queue=5)
    first = _ticket(core.request(1, "default"))
    waiter = _ticket(core.request(1, "default"))
    assert core.withdraw(waiter, "cancelled").removed
    assert core.release(first, "completed") == ()
    assert core.snapshot().rejected == {}
    assert core.queued == 0


def test_withdraw_after_grant_reports_the_grant_won() -> None:
    """A timeout arriving after the grant loses: the grant stands and must be released."""
    core = Admission(limit=1, max_queue=5)
    first = _ticket(core.request(1, "default"))
    waiter = _ticket(core.request(1, "default"))
    core.release(first, "completed")
    assert not core.withdraw(waiter, "timeout").removed
    assert core.is_granted(waiter)


def test_drain_rejects_waiters_and_new_requests() -> None:
    """Draining hands back every queued ticket and refuses newcomers with 'draining'."""
    core = Admission(limit=1, max_queue=5)
    core.request(1, "default")
    waiters = [_ticket(core.request(1, "default")) for _ in range(2)]
    assert core.drain() == tuple(waiters)
    decision = core.request(1, "default")
    assert isinstance(decision, Rejected)
    assert decision.reason == "draining"
    assert core.snapshot().rejected == {"draining": 3}


def test_max_in_flight_caps_the_count_in_token_mode() -> None:
    """A hard cap of 2 requests holds even when the byte pool has room for more."""
    core = Admission(limit=1000, max_queue=5, max_in_flight=2)
    kinds = [type(core.request(10, "default")).__name__ for _ in range(3)]
    assert kinds == ["Granted", "Granted", "Queued"]


def test_a_release_under_max_in_flight_lets_one_waiter_in_not_all_that_fit() -> None:
    """Bytes for every waiter, but one request slot freed: one grant, the rest keep waiting."""
    core = Admission(limit=1000, max_queue=5, max_in_flight=2)
    first, _, *waiting = [_ticket(core.request(10, "default")) for _ in range(4)]
    grants = core.release(first, "completed")
    assert [grant.ticket for grant in grants] == waiting[:1]
    assert (core.in_use, core.queued) == (2, 1)


def test_settling_a_running_request_lets_the_next_in_and_never_raises_its_cost() -> None:
    """A stream that started holds nothing of a limit on starts: the waiter behind it is
    granted; settling cannot raise a cost, and an unknown ticket is refused."""
    core = Admission(limit=1, max_queue=2)
    first, second = (_ticket(core.request(1, "default")) for _ in range(2))
    assert core.queued == 1
    grants = core.settle(first, 0)
    assert [g.ticket for g in grants] == [second]
    assert (core.in_use, core.in_use_cost) == (2, 1)
    assert core.settle(second, 5) == ()
    assert core.in_use_cost == 1
    with pytest.raises(UnknownTicketError):
        core.settle(999, 0)


@pytest.mark.parametrize(
    ("wait_s", "refused"),
    [
        pytest.param(None, False, id="no-rate-yet-it-waits"),
        pytest.param(1.0, False, id="wait-equal-to-the-bound-waits"),
        pytest.param(1.5, True, id="wait-past-the-bound-refused-now"),
    ],
)
def test_a_hopeless_wait_is_refused_now_as_queue_full(wait_s: float | None, refused: bool) -> None:
    """A request just queued whose estimated wait passes what it may wait is taken out and
    refused queue_full (counted once); one within it, or not yet estimated, keeps its place."""
    core = Admission(limit=1, max_queue=4)
    core.request(1, DEFAULT)
    queued = core.request(1, DEFAULT)
    assert isinstance(queued, Queued)
    hopeless = core.refuse_hopeless(queued, wait_s, max_wait_s=1.0)
    if not refused:
        assert (hopeless, core.queued, core.snapshot().rejected) == (None, 1, {})
        return
    expected = Rejected(reason="queue_full", compartment=DEFAULT, cost=1, queued=0)
    assert hopeless == Hopeless(refusal=expected, granted=())
    assert (core.queued, core.snapshot().rejected) == (0, {"queue_full": 1})


def test_a_hopeless_waiter_leaving_lets_a_borrower_in() -> None:
    """A hopeless head that blocked borrowing is taken out: the borrower behind it is granted."""
    core = Admission(limit=10, max_queue=4, compartments=parse_compartments("a=50%,b=0%"))
    core.request(5, "a")
    core.request(3, "b")  # b borrows a's idle share: 8 of 10 in use
    head = core.request(5, "a")  # within a's guarantee, but no room: waits
    borrower = core.request(2, "b")  # fits, but may not borrow past an older waiting head
    assert isinstance(head, Queued)
    assert isinstance(borrower, Queued)
    hopeless = core.refuse_hopeless(head, 9.0, max_wait_s=1.0)
    assert hopeless is not None
    assert hopeless.granted == (Granted(borrower.ticket, "b", 2),)


@pytest.mark.parametrize(
    ("held", "started", "expected"),
    [
        pytest.param(1, 0, Started(cost=0), id="slo-stream-holds-nothing-of-the-starts"),
        pytest.param(1, None, None, id="mode-without-a-started-price"),
        pytest.param(1, 1, None, id="already-at-the-started-price"),
        pytest.param(0, 0, None, id="non-stream-held-nothing-to-free"),
    ],
)
def test_a_started_stream_holds_the_modes_started_price(
    held: int, started: int | None, expected: Started | None
) -> None:
    """The start gate: a running stream whose first token came holds the mode's started price
    from now, where that is less than it holds; else nothing changes."""
    core = Admission(limit=1, max_queue=2)
    ticket = _ticket(core.request(held, DEFAULT))
    assert core.start(ticket, started) == expected
    assert core.in_use_cost == (held if expected is None else expected.cost)


def test_a_started_stream_lets_the_next_in() -> None:
    """The room a started stream frees goes to the waiter behind it; a ticket that holds no
    grant (still queued: shadow mode runs it meanwhile) changes nothing."""
    core = Admission(limit=1, max_queue=2)
    first, second, third = (_ticket(core.request(1, DEFAULT)) for _ in range(3))
    assert core.start(third, 0) is None
    assert core.start(first, 0) == Started(cost=0, granted=(Granted(second, DEFAULT, 1),))
    assert (core.in_use, core.in_use_cost, core.queued) == (2, 1, 1)


# --- stateful property test ----------------------------------------------------------------------

COMPARTMENTS = parse_compartments("a=40%:70%,b=30%")
NAMES = ("a", "b", "default", "unknown")
MAX_IN_FLIGHT = 5


class AdmissionMachine(RuleBasedStateMachine):
    """Random requests, releases, withdrawals and resizes against the invariants of the brief.

    The machine keeps its own model (who waits where, who holds what) and checks every grant the
    core reports against it.
    """

    waiting = Bundle("waiting")
    spec = COMPARTMENTS

    def __init__(self) -> None:
        super().__init__()
        self.core = Admission(
            limit=6,
            max_queue=4,
            compartments=self.spec,
            max_in_flight=MAX_IN_FLIGHT,
        )
        self.live: set[int] = set()
        self.cost: dict[int, tuple[str, int]] = {}
        self.used: dict[str, int] = dict.fromkeys(self.spec.names, 0)
        self.pending: dict[str, list[int]] = {n: [] for n in self.spec.names}
        self.high_water = 6

    def _guaranteed(self) -> dict[str, int]:
        return {spec.name: spec.guaranteed(self.core.limit) for spec in self.spec.specs}

    def _owners_waiting(self, besides: str) -> list[str]:
        """Compartments other than ``besides`` whose first waiter fits within their guarantee."""
        guaranteed = self._guaranteed()
        return [
            name
            for name, queue in self.pending.items()
            if queue and name != besides
            if self.used[name] + self.cost[queue[0]][1] <= guaranteed[name]
        ]

    def _take(self, ticket: int, name: str, cost: int) -> None:
        if self.used[name] + cost > self._guaranteed()[name]:
            assert not self._owners_waiting(name), "borrowed while an owner waits for its share"
            caps = {c.name: c.ceiling for c in self.core.snapshot().compartments}
            older = [
                q[0]
                for n, q in self.pending.items()
                if q and q[0] < ticket and self.cost[q[0]][1] <= caps[n]
            ]
            assert not older, "a borrower passed an older waiting request (starvation)"
        self.used[name] += cost
        self.live.add(ticket)
        assert sum(self.used.values()) <= self.core.limit, "a grant went over the limit"

    def _granted(self, grants: tuple[Granted, ...]) -> None:
        for grant in grants:
            queue = self.pending[grant.compartment]
            assert queue, "granted a ticket that was not waiting"
            assert queue[0] == grant.ticket, "FIFO broken within a compartment"
            queue.pop(0)
            self._take(grant.ticket, grant.compartment, grant.cost)

    @rule(
        target=waiting, cost=st.integers(1, 4), name=st.sampled_from(NAMES), may_wait=st.booleans()
    )
    def request(self, cost: int, name: str, may_wait: bool) -> int:
        decision = self.core.request(cost, name, may_wait=may_wait)
        assert may_wait or not isinstance(decision, Queued), "sheddable traffic never waits"
        if isinstance(decision, Rejected):
            return -1
        self.cost[decision.ticket] = (decision.compartment, cost)
        if isinstance(decision, Granted):
            assert not self.pending[decision.compartment], "overtook a waiter of its compartment"
            self._take(decision.ticket, decision.compartment, cost)
        else:
            self.pending[decision.compartment].append(decision.ticket)
        return decision.ticket

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), outcome=st.sampled_from(["completed", "cancelled", "failed"]))
    def release(self, data: st.DataObject, outcome: str) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.live)))
        self.live.remove(ticket)
        name, cost = self.cost[ticket]
        self.used[name] -= cost
        self._granted(self.core.release(ticket, outcome))  # type: ignore[arg-type]
        with pytest.raises(UnknownTicketError):
            self.core.release(ticket, "completed")

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), extra=st.integers(1, 3))
    def grow(self, data: st.DataObject, extra: int) -> None:
        """A running stream holds more than it was charged (adaptive ledger): nothing revoked."""
        ticket = data.draw(st.sampled_from(sorted(self.live)))
        name, cost = self.cost[ticket]
        self.core.grow(ticket, cost + extra)
        self.cost[ticket] = (name, cost + extra)
        self.used[name] += extra
        self.high_water = max(self.core.limit, self.core.in_use_cost)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), left=st.integers(0, 1))
    def settle(self, data: st.DataObject, left: int) -> None:
        """A running stream's first token (slo's start gate): it holds less from now, never
        more, and the room lets waiters in."""
        ticket = data.draw(st.sampled_from(sorted(self.live)))
        name, cost = self.cost[ticket]
        kept = min(cost, left)
        self.cost[ticket] = (name, kept)
        self.used[name] -= cost - kept
        self._granted(self.core.settle(ticket, left))

    @rule(ticket=consumes(waiting), reason=st.sampled_from(["timeout", "cancelled"]))
    def withdraw(self, ticket: int, reason: str) -> None:
        was_pending = any(ticket in q for q in self.pending.values())
        for queue in self.pending.values():
            if ticket in queue:
                queue.remove(ticket)
        withdrawal = self.core.withdraw(ticket, reason)  # type: ignore[arg-type]
        assert withdrawal.removed == was_pending, "withdraw disagrees with who is queued"
        self._granted(withdrawal.granted)

    @rule(limit=st.integers(0, 12))
    def resize(self, limit: int) -> None:
        grants = self.core.resize(limit)
        for ticket in self.core.refused_oversize():
            name, cost = self.cost[ticket]
            assert limit > 0, "refused as too large while nothing can run at all"
            assert cost > self._caps()[name], "refused a request that could fit"
            self.pending[name].remove(ticket)
        self._granted(grants)
        self.high_water = max(limit, self.core.in_use_cost)

    def _caps(self) -> dict[str, int]:
        return {c.name: c.ceiling for c in self.core.snapshot().compartments}

    @invariant()
    def no_waiter_that_can_never_fit(self) -> None:
        """After any step, nothing queued is bigger than its compartment's ceiling (limit > 0);
        one unit (a count-mode request of one sequence) is never too large: it waits."""
        if self.core.limit == 0:
            return
        caps = self._caps()
        for name, queue in self.pending.items():
            assert all(self.cost[t][1] <= max(1, caps[name]) for t in queue), "head of line blocked"

    @invariant()
    def in_flight_within_limit_except_after_a_shrink(self) -> None:
        assert self.core.in_use_cost == sum(self.used.values())
        assert self.core.in_use_cost <= max(self.core.limit, self.high_water)
        self.high_water = max(self.core.limit, self.core.in_use_cost)

    @invariant()
    def queue_bounded(self) -> None:
        assert self.core.queued == sum(len(q) for q in self.pending.values()) <= 4

    @invariant()
    def hard_cap_on_requests_held(self) -> None:
        assert len(self.live) <= MAX_IN_FLIGHT

    @invariant()
    def every_grant_accounted(self) -> None:
        snap = self.core.snapshot()
        assert snap.granted_total == sum(snap.released.values()) + len(self.live)
        assert snap.in_use == len(self.live)

    @invariant()
    def nobody_waits_while_capacity_is_free(self) -> None:
        """The oldest waiter, and any waiter within its guarantee, waits only for real reasons."""
        if len(self.live) >= MAX_IN_FLIGHT:
            return
        caps = {c.name: c.ceiling for c in self.core.snapshot().compartments}
        free = self.core.limit - sum(self.used.values())
        heads = sorted(q[0] for q in self.pending.values() if q)
        owners = self._owners_waiting(besides="")
        for position, ticket in enumerate(heads):
            name, cost = self.cost[ticket]
            fits = cost <= free and self.used[name] + cost <= caps[name]
            if name in owners:
                assert not fits, f"{name} waits within its guarantee while room is free"
            elif position == 0:
                assert not fits or owners, "the oldest waiter waits while room is free"

    def teardown(self) -> None:
        queued = sorted(t for q in self.pending.values() for t in q)
        assert self.core.drain() == tuple(queued)
        for ticket in sorted(self.live):
            assert self.core.release(ticket, "completed") == ()
        assert self.core.in_use_cost == 0


class PlainAdmissionMachine(AdmissionMachine):
    """The same invariants without compartments (the plain FIFO path)."""

    spec = Compartments()


AdmissionMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
PlainAdmissionMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None
)
TestAdmissionMachine = AdmissionMachine.TestCase
TestPlainAdmissionMachine = PlainAdmissionMachine.TestCase


def test_grow_blocks_new_grants_but_revokes_nothing() -> None:
    """A running stream that outgrows its charge keeps running; the next request must wait."""
    core = Admission(limit=100, max_queue=4)
    first = core.request(40, DEFAULT)
    assert isinstance(first, Granted)
    core.grow(first.ticket, 90)
    assert core.in_use_cost == 90
    assert isinstance(core.request(20, DEFAULT), Queued)
    assert core.is_granted(first.ticket)
    granted = core.release(first.ticket, "completed")
    assert [g.cost for g in granted] == [20]


def test_ceiling_decides_too_large_on_the_worst_case() -> None:
    """Adaptive: a cheap expected price is refused too_large if its worst case beats the pool."""
    core = Admission(limit=100, max_queue=4, reach=Pool(500))
    core.resize(100)
    assert isinstance(core.request(10, DEFAULT, worst=400), Granted)
    refused = core.request(10, DEFAULT, worst=501)
    assert isinstance(refused, Rejected)
    assert refused.reason == "too_large"


def test_unavailable_refuses_at_once_and_the_queue_too() -> None:
    """No capacity at all: new requests and queued ones get no_capacity, not a wait."""
    core = Admission(limit=1, max_queue=4)
    core.request(1, DEFAULT)
    queued = core.request(1, DEFAULT)
    assert isinstance(queued, Queued)
    assert core.set_available(False) == (queued.ticket,)
    refused = core.request(1, DEFAULT)
    assert isinstance(refused, Rejected)
    assert refused.reason == "no_capacity"
    core.set_available(True)
    assert isinstance(core.request(1, DEFAULT), Queued)


def test_a_request_that_may_not_wait_is_shed_instead_of_queued() -> None:
    """Sheddable traffic runs if there is room now, else is refused ``shed``; the queue stays."""
    core = Admission(limit=1, max_queue=4)
    running = core.request(1, "default", may_wait=False)
    waiter = core.request(1, "default")
    shed = core.request(1, "default", may_wait=False)
    assert isinstance(running, Granted)
    assert isinstance(waiter, Queued)
    assert isinstance(shed, Rejected)
    assert (shed.reason, core.queued) == ("shed", 1)
    assert core.release(running.ticket, "completed") == (Granted(waiter.ticket, "default", 1),)
