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

from sidecar.admission import Admission, Granted, Queued, Rejected, UnknownTicketError
from sidecar.compartments import parse_compartments


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
    core = Admission(limit=1000, max_queue=10, reject_oversize=True)
    decision = core.request(1001, "default")
    assert isinstance(decision, Rejected)
    assert decision.reason == "too_large"


def test_token_mode_small_requests_share_the_pool() -> None:
    """Short requests each pay their own cost: four of 250 fit in 1000, a fifth waits."""
    core = Admission(limit=1000, max_queue=10, reject_oversize=True)
    kinds = [type(core.request(250, "default")).__name__ for _ in range(5)]
    assert kinds == ["Granted"] * 4 + ["Queued"]


def test_large_head_is_not_overtaken_by_small_ones() -> None:
    """A big waiter at the head blocks later small ones in its compartment until it fits."""
    core = Admission(limit=1000, max_queue=10, reject_oversize=True)
    small = _ticket(core.request(600, "default"))
    big = _ticket(core.request(800, "default"))
    later = core.request(100, "default")
    assert isinstance(later, Queued)
    woken = core.release(small, "completed")
    assert [g.ticket for g in woken] == [big, later.ticket]


def test_borrowing_stops_behind_an_older_waiting_head() -> None:
    """b may not borrow past a's older waiting request, so borrowed room drains back to a."""
    comps = parse_compartments("a=30%,b=30%,default=10%")  # 3 + 3 + 1 reserved, 3 to borrow
    core = Admission(limit=10, max_queue=10, compartments=comps, reject_oversize=True)
    b_running = _ticket(core.request(5, "b"))  # 3 of its own + 2 borrowed
    a_big = core.request(6, "a")  # 3 of its own + the 3 borrowable: must wait for b
    b_more = core.request(1, "b")  # would fit by borrowing, but a waits first
    assert isinstance(a_big, Queued)
    assert isinstance(b_more, Queued)
    woken = core.release(b_running, "completed")
    assert [g.ticket for g in woken] == [a_big.ticket, b_more.ticket]


def test_compartment_at_its_cap_queues_without_touching_others_reserve() -> None:
    """Tenant a (share 20%, cap 50%) stops at 5 of 10 and queues; b's 30% stays free for b."""
    comps = parse_compartments("a=20%:50%,b=30%,default=10%")
    core = Admission(limit=10, max_queue=10, compartments=comps)
    kinds = [type(core.request(1, "a")).__name__ for _ in range(6)]
    assert kinds == ["Granted"] * 5 + ["Queued"]
    b_kinds = [type(core.request(1, "b")).__name__ for _ in range(3)]
    assert b_kinds == ["Granted"] * 3


def test_borrowed_capacity_is_given_back_to_the_owner() -> None:
    """Tenant a borrows the idle default share; as its work ends, default's waiter gets it."""
    core = Admission(limit=4, max_queue=10, compartments=parse_compartments("a=50%"))
    a_tickets = [_ticket(core.request(1, "a")) for _ in range(2)]
    extra = core.request(1, "a")
    assert isinstance(extra, Queued), "default's reserve of 2 is not a's to take"
    d1 = core.request(1, "stranger")  # unknown key -> default
    assert isinstance(d1, Granted)
    assert d1.compartment == "default"
    assert [g.ticket for g in core.release(a_tickets[0], "completed")] == [extra.ticket]


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
    core = Admission(limit=1000, max_queue=5, max_in_flight=2, reject_oversize=True)
    kinds = [type(core.request(10, "default")).__name__ for _ in range(3)]
    assert kinds == ["Granted", "Granted", "Queued"]


# --- stateful property test ----------------------------------------------------------------------

COMPARTMENTS = parse_compartments("a=40%:70%,b=30%")
NAMES = ("a", "b", "default", "unknown")
MAX_IN_FLIGHT = 5


class AdmissionMachine(RuleBasedStateMachine):
    """Random requests, releases, withdrawals and resizes against the invariants of the brief."""

    granted = Bundle("granted")
    waiting = Bundle("waiting")

    def __init__(self) -> None:
        super().__init__()
        self.core = Admission(
            limit=6,
            max_queue=4,
            compartments=COMPARTMENTS,
            reject_oversize=True,
            max_in_flight=MAX_IN_FLIGHT,
        )
        self.live: set[int] = set()
        self.pending: dict[str, list[int]] = {n: [] for n in COMPARTMENTS.names}
        self.high_water = 6
        self.reserve_intact = True

    def _granted(self, grants: tuple[Granted, ...]) -> None:
        if grants:
            assert self.core.in_use_cost <= self.core.limit, "a grant went over the limit"
        for grant in grants:
            queue = self.pending[grant.compartment]
            assert queue, "granted a ticket that was not waiting"
            assert queue[0] == grant.ticket, "FIFO broken within a compartment"
            queue.pop(0)
            assert grant.ticket not in self.live
            self.live.add(grant.ticket)

    @rule(target=waiting, cost=st.integers(1, 4), name=st.sampled_from(NAMES))
    def request(self, cost: int, name: str) -> int:
        decision = self.core.request(cost, name)
        if isinstance(decision, Granted):
            assert not self.pending[decision.compartment], "overtook a waiter of its compartment"
            self.live.add(decision.ticket)
            assert self.core.in_use_cost <= self.core.limit
        elif isinstance(decision, Queued):
            self.pending[decision.compartment].append(decision.ticket)
        return decision.ticket if not isinstance(decision, Rejected) else -1

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data(), outcome=st.sampled_from(["completed", "cancelled", "failed"]))
    def release(self, data: st.DataObject, outcome: str) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.live)))
        self.live.remove(ticket)
        self._granted(self.core.release(ticket, outcome))  # type: ignore[arg-type]
        with pytest.raises(UnknownTicketError):
            self.core.release(ticket, "completed")

    @rule(ticket=consumes(waiting), reason=st.sampled_from(["timeout", "cancelled"]))
    def withdraw(self, ticket: int, reason: str) -> None:
        was_pending = any(ticket in q for q in self.pending.values())
        withdrawal = self.core.withdraw(ticket, reason)  # type: ignore[arg-type]
        assert withdrawal.removed == was_pending, "withdraw disagrees with who is queued"
        for queue in self.pending.values():
            if ticket in queue:
                queue.remove(ticket)
        self._granted(withdrawal.granted)

    @rule(limit=st.integers(0, 12))
    def resize(self, limit: int) -> None:
        self._granted(self.core.resize(limit))
        self.reserve_intact = False
        self.high_water = max(limit, self.core.in_use_cost)

    @invariant()
    def in_flight_within_limit_except_after_a_shrink(self) -> None:
        assert self.core.in_use_cost <= max(self.core.limit, self.high_water)
        self.high_water = max(self.core.limit, self.core.in_use_cost)

    @invariant()
    def queue_bounded(self) -> None:
        assert self.core.queued <= 4

    @invariant()
    def hard_cap_on_requests_held(self) -> None:
        assert len(self.live) <= MAX_IN_FLIGHT

    @invariant()
    def every_grant_accounted(self) -> None:
        snap = self.core.snapshot()
        assert snap.granted_total == sum(snap.released.values()) + len(self.live)
        assert snap.in_use == len(self.live)

    @invariant()
    def compartment_guarantees_held(self) -> None:
        snap = self.core.snapshot()
        reserve = sum(max(c.guaranteed - c.in_use_cost, 0) for c in snap.compartments)
        intact = snap.limit - snap.in_use_cost >= reserve
        # Only a resize may leave reserves uncovered (running work is never revoked).
        assert intact or not self.reserve_intact, "a grant ate into another compartment's reserve"
        self.reserve_intact = intact
        if not intact or len(self.live) >= MAX_IN_FLIGHT:
            return
        for part in snap.compartments:
            queue = self.pending[part.name]
            if queue:
                head_cost = self.core._queued_tickets[queue[0]].cost
                assert part.in_use_cost + head_cost > part.guaranteed, (
                    f"{part.name} waits although its guarantee has room"
                )

    @invariant()
    def nobody_waits_while_the_whole_limit_is_free(self) -> None:
        if self.core.in_use_cost == 0 and self.core.queued:
            ceiling = {c.name: c.ceiling for c in self.core.snapshot().compartments}
            heads = [self.core._queued_tickets[q[0]] for q in self.pending.values() if q]
            for head in heads:
                assert head.cost > ceiling[head.compartment], "waits on an idle bulkhead"

    def teardown(self) -> None:
        queued = sorted(t for q in self.pending.values() for t in q)
        assert self.core.drain() == tuple(queued)
        for ticket in sorted(self.live):
            assert self.core.release(ticket, "completed") == ()
        assert self.core.in_use_cost == 0


AdmissionMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
TestAdmissionMachine = AdmissionMachine.TestCase
