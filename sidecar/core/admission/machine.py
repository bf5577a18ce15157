"""The admission state machine: limit, in-flight work, bounded queues; no clock, no I/O.

Every call returns what happened as frozen values; the asyncio layer (``bulkhead``) turns them into
woken waiters and timers. Costs are in the admission mode's unit
(``sidecar.core.admission.modes``): permits, KV bytes or tokens.

Compartments borrow: capacity another compartment leaves idle, its reserve included, may be used
up to the borrower's cap. Nothing is revoked, so borrowed capacity comes back as that work ends;
meanwhile no new borrowing is granted while any other compartment has a request waiting within
its own guarantee, so the owner is the next to be served.

Head of line after a shrink: where the limit is all there is (no ceiling beyond it: count, slo
and tokens modes), a queued request of more than one unit bigger than its compartment's new
ceiling can never run, so a resize refuses it at once (``too_large``, collected through
``refused_oversize()``) and those behind it are considered in the same pass.

Waits and starts: a request just queued whose estimated wait passes what it may wait is refused
at once (``refuse_hopeless``: the estimate is the caller's, from the Retry-After hint; the refusal
is decided here), and a stream whose first token came holds the mode's started price from then
(``start``: slo's start gate).

Grant order by source (``sidecar.core.admission.fair_queue``): each request may name its source
(a tenant or a client address; None is one shared anonymous source). Among a compartment's
waiters, the one whose source holds the fewest places (granted requests, whatever their cost) in
the compartment goes first, the oldest first among equals: a source holding nothing goes before
one holding a hundred, and with one source (no sources given) the queue is first come, first
served. ``Queued.ahead``, ``queued_ahead`` and ``grant_order`` count in that order.

Starvation: a waiter's head-of-line place is kept: whatever is next in its compartment's order
(a large request too) is never overtaken inside its compartment. A waiter ranks by the places
its source holds plus its source's waiters older than it; that never rises while it waits, and
only waiters ranked lower (from sources holding fewer places) can overtake it, so the first
waiter of a source holding nothing is never overtaken by a later one; a source holding more
waits on, its own deadline bounding its wait. Across compartments, a compartment is as old as
its oldest waiter: once one waits with its head waiting for room, no later request may *borrow*;
borrowed capacity drains back as running work ends, and the waiting head is granted once it
fits. Only other compartments' own guarantees can still pass it, and those are bounded, so a
head that fits within its own guarantee is never starved.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from typing import Protocol, get_args

from sidecar.core.admission.compartments import DEFAULT, Compartments
from sidecar.core.admission.decisions import (
    AdmissionSnapshot,
    CompartmentSnapshot,
    Decision,
    Granted,
    Hopeless,
    Outcome,
    Queued,
    Rejected,
    Started,
    UnknownTicketError,
    Withdrawal,
    WithdrawReason,
)
from sidecar.core.admission.fair_queue import FairQueue, Waiter
from sidecar.core.outcomes import RejectReason


class Reach(Protocol):
    """What the admission mode says can ever run (``sidecar.core.admission.modes``)."""

    def ceiling(self) -> int | None:
        """The largest worst case that can ever run; None: the limit's own reach."""
        ...


class _LimitReach:
    """The limit is all there is: what cannot fit it is refused, one unit excepted."""

    def ceiling(self) -> int | None:
        return None


class Admission:
    """Admission decisions for one bulkhead; all methods are synchronous and O(compartments),
    times O(sources waiting in a compartment) where waiters of several sources wait (the
    order by source, bounded by the queue's bound; no sources given: one)."""

    def __init__(
        self,
        *,
        limit: int,
        max_queue: int,
        compartments: Compartments | None = None,
        max_in_flight: int | None = None,
        reach: Reach | None = None,
    ) -> None:
        if limit < 0 or max_queue < 0:
            raise ValueError("limit and max_queue must be >= 0")
        self._max_queue = max_queue
        self._compartments = compartments or Compartments()
        self._set_limit(limit)
        self._max_in_flight_setting = max_in_flight
        self._max_in_flight = max_in_flight  # the setting, or the engine's slots where fewer
        # A request bigger than its compartment's whole reach can never run at this limit. One
        # unit is never refused so: in count mode it is one request, which waits as it always has.
        # A mode whose limit grows back (adaptive) names a ceiling beyond it instead.
        self._reach: Reach = reach or _LimitReach()
        names = self._compartments.names
        self._queues: dict[str, FairQueue] = {n: FairQueue() for n in names}
        self._used: dict[str, int] = dict.fromkeys(names, 0)
        self._used_total = 0
        self._count: dict[str, int] = dict.fromkeys(names, 0)
        self._granted: dict[int, Waiter] = {}
        self._queued_tickets: dict[int, Waiter] = {}
        self._next_ticket = 0
        self._evicted: list[int] = []
        self._draining = False
        self._ceiling: int | None = None  # largest cost that can ever run (None: the cap)
        self._available = True
        self._granted_total = 0
        self._queued_total = 0
        self._rejected: Counter[str] = Counter()
        # Seeded with every outcome, so that a snapshot lists the ones that never happened too.
        self._released: dict[str, int] = dict.fromkeys(get_args(Outcome), 0)
        self._guarded = False  # draining, no capacity, or a ceiling: request() checks them all

    # --- decisions -------------------------------------------------------------------------------

    def request(
        self,
        cost: int,
        compartment: str,
        worst: int | None = None,
        *,
        may_wait: bool = True,
        source: str | None = None,
    ) -> Decision:
        """Decide a new request of ``cost`` in ``compartment`` (resolved through the spec).

        ``worst`` is what it may grow to (adaptive pricing); it alone decides ``too_large``.
        ``may_wait=False`` (sheddable traffic): granted now or refused ``shed``, never queued.
        ``source``: who sent it (None: the one anonymous source), for the grant order by source.
        """
        name = compartment if compartment in self._queues else DEFAULT
        if self._guarded or cost > self._cap[name]:
            refusal = self._refusal(cost, name, cost if worst is None else worst)
            if refusal is not None:
                return self._reject(refusal, name, cost)
        self._next_ticket += 1
        ticket = self._next_ticket
        waiter = Waiter(ticket, name, cost, source)
        alone = not self._queued_tickets
        if alone and self._fits(waiter):  # with nobody waiting, nobody is older: the pump's answer
            self._grant(waiter)
            return Granted(ticket, name, cost)
        queue = self._queues[name]
        queue.append(waiter)
        self._queued_tickets[waiter.ticket] = waiter
        # Every other head was pumped already: only the newcomer can be granted, and only as a
        # head. Alone, it was just found not to fit, and the pump would find the same.
        if not alone and queue.head() is waiter:
            self._pump()
            if waiter.ticket in self._granted:
                return Granted(waiter.ticket, name, cost)
        if len(self._queued_tickets) > self._max_queue or not may_wait:
            self._remove_queued(waiter)
            return self._reject("queue_full" if may_wait else "shed", name, cost)
        self._queued_total += 1
        return Queued(ticket=ticket, compartment=name, cost=cost, ahead=queue.ahead_of(waiter))

    def release(self, ticket: int, outcome: Outcome) -> tuple[Granted, ...]:
        """End granted work; returns the waiters this frees room for, in grant order."""
        waiter = self._granted.pop(ticket, None)
        if waiter is None:
            raise UnknownTicketError(ticket)
        self._used[waiter.compartment] -= waiter.cost
        self._used_total -= waiter.cost
        self._count[waiter.compartment] -= 1
        self._queues[waiter.compartment].free(waiter.source)
        self._released[outcome] += 1
        return self._pump() if self._queued_tickets else ()  # the common release: nobody waits

    def withdraw(self, ticket: int, reason: WithdrawReason) -> Withdrawal:
        """Take a waiter out of its queue (timed out, cancelled, draining).

        Not removed means the grant won the race (or the waiter is already gone): the caller then
        owns a grant to release, if ``is_granted(ticket)``.
        """
        waiter = self._queued_tickets.get(ticket)
        if waiter is None:
            return Withdrawal(removed=False)
        self._remove_queued(waiter)
        if reason != "cancelled":
            self._rejected[reason] += 1
        return Withdrawal(removed=True, granted=self._pump())

    def resize(self, limit: int) -> tuple[Granted, ...]:
        """Set a new limit; growing grants waiters now (in grant order), shrinking revokes nothing.

        The mode's ceiling (the largest worst case that can ever run, where it is not the limit
        itself: adaptive's whole pool) is read again with each new limit.
        """
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self._set_limit(limit)
        self._ceiling = self._reach.ceiling()
        self._reguard()
        self._evict_oversize()
        return self._pump()

    def cap_in_flight(self, slots: int | None) -> tuple[Granted, ...]:
        """The engine's fixed slots (llama.cpp's ``-np``), where it has them: never more requests
        in flight, whatever the limit (a request past them would only wait at the engine, outside
        this queue). Returns the waiters a larger cap lets in."""
        caps = [c for c in (self._max_in_flight_setting, slots) if c is not None]
        self._max_in_flight = min(caps) if caps else None
        return self._pump()

    def refused_oversize(self) -> tuple[int, ...]:
        """Queued tickets that resizes since the last call refused as ``too_large``."""
        tickets, self._evicted = tuple(self._evicted), []
        return tickets

    def grow(self, ticket: int, cost: int) -> None:
        """A running request now holds more (adaptive ledger); never revokes, only blocks grants."""
        waiter = self._granted.get(ticket)
        if waiter is None:
            raise UnknownTicketError(ticket)
        extra = max(0, cost - waiter.cost)
        waiter.cost += extra
        self._used[waiter.compartment] += extra
        self._used_total += extra

    def settle(self, ticket: int, cost: int) -> tuple[Granted, ...]:
        """A running request now holds less (``cost``, never more than it holds): the SLO start
        gate's stream, whose first token came. Returns the waiters the room lets in."""
        waiter = self._granted.get(ticket)
        if waiter is None:
            raise UnknownTicketError(ticket)
        freed = max(0, waiter.cost - max(0, cost))
        waiter.cost -= freed
        self._used[waiter.compartment] -= freed
        self._used_total -= freed
        return self._pump() if freed and self._queued_tickets else ()

    def refuse_hopeless(
        self, queued: Queued, wait_s: float | None, max_wait_s: float
    ) -> Hopeless | None:
        """The request just ``queued``, whose wait is estimated at ``wait_s`` (None: not known
        yet), waits on unless that is past ``max_wait_s`` (None then): it would only time out,
        so it is taken out of its queue and refused now (queue_full)."""
        if wait_s is None or wait_s <= max_wait_s:
            return None
        withdrawal = self.withdraw(queued.ticket, "queue_full")
        refusal = Rejected(
            reason="queue_full",
            compartment=queued.compartment,
            cost=queued.cost,
            queued=self.queued,
        )
        return Hopeless(refusal=refusal, granted=withdrawal.granted)

    def start(self, ticket: int, started: int | None) -> Started | None:
        """``ticket``'s stream started (its first token came): where the mode prices a started
        stream at ``started`` (slo's start gate: 0), less than it holds, it holds that from now
        and the room lets waiters in. None where nothing changes: the mode has no such price, it
        holds no more, or ``ticket`` holds no grant (shadow: it runs without one)."""
        waiter = self._granted.get(ticket)
        if started is None or waiter is None or waiter.cost <= started:
            return None
        return Started(cost=started, granted=self.settle(ticket, started))

    def set_available(self, available: bool) -> tuple[int, ...]:
        """No capacity at all (a plan of 0 permits): refuse at once, and the queued too.

        Returns the queued tickets now refused ("no_capacity").
        """
        self._available = available
        self._reguard()
        if available:
            return ()
        tickets = tuple(sorted(self._queued_tickets))
        for ticket in tickets:
            self._remove_queued(self._queued_tickets[ticket])
            self._rejected["no_capacity"] += 1
        return tickets

    def drain(self) -> tuple[int, ...]:
        """Refuse everything from now on; returns the queued tickets, now rejected ("draining")."""
        self._draining = True
        self._reguard()
        tickets = tuple(sorted(self._queued_tickets))
        for ticket in tickets:
            self.withdraw(ticket, "draining")
        return tickets

    def is_granted(self, ticket: int) -> bool:
        """True while ``ticket`` holds a grant not yet released."""
        return ticket in self._granted

    # --- state -----------------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def queued(self) -> int:
        return len(self._queued_tickets)

    @property
    def in_use(self) -> int:
        return len(self._granted)

    @property
    def in_use_cost(self) -> int:
        return self._used_total

    @property
    def in_flight_limit(self) -> int | None:
        """The cap on requests in flight in force: the setting, the engine's slots or the mode's
        own cap (slo's), the least of them; None where there is none."""
        return self._max_in_flight

    def queued_ahead(self, compartment: str, source: str | None = None) -> int:
        """Waiters in the compartment ``compartment`` resolves to that are to be granted before
        a request of ``source`` queued now (all of them where ``source`` holds the most)."""
        return self._queues.get(compartment, self._queues[DEFAULT]).ahead_of_newcomer(source)

    def grant_order(self) -> tuple[int, ...]:
        """The queued tickets in the order they are to be granted as things stand: each
        compartment's by source (``FairQueue.order``), the compartments' merged as the pump
        takes their heads, the compartment whose oldest waiter is oldest first (guarantees and
        borrowing aside). O(waiters log waiters)."""
        orders = [[w.ticket for w in queue.order()] for queue in self._queues.values() if queue]
        # Each compartment's oldest waiter from each place in its order on.
        oldest = [list(itertools.accumulate(reversed(order), min))[::-1] for order in orders]
        heads = [(oldest[n][0], n, 0) for n in range(len(orders))]
        heapq.heapify(heads)
        tickets: list[int] = []
        while heads:
            _, n, at = heapq.heappop(heads)
            tickets.append(orders[n][at])
            if at + 1 < len(orders[n]):
                heapq.heappush(heads, (oldest[n][at + 1], n, at + 1))
        return tuple(tickets)

    def queued_cost_ahead(self, compartment: str) -> int:
        """The cost of the waiters in the compartment ``compartment`` resolves to."""
        return sum(w.cost for w in self._queues.get(compartment, self._queues[DEFAULT]))

    def snapshot(self) -> AdmissionSnapshot:
        """Freeze the current state and counters."""
        parts = tuple(
            CompartmentSnapshot(
                name=spec.name,
                guaranteed=self._guaranteed[spec.name],
                ceiling=self._cap[spec.name],
                in_use=self._count[spec.name],
                in_use_cost=self._used[spec.name],
                queued=len(self._queues[spec.name]),
            )
            for spec in self._compartments.specs
        )
        return AdmissionSnapshot(
            limit=self._limit,
            in_use=self.in_use,
            in_use_cost=self.in_use_cost,
            queued=self.queued,
            draining=self._draining,
            compartments=parts,
            granted_total=self._granted_total,
            queued_total=self._queued_total,
            rejected=dict(self._rejected),
            released={outcome: n for outcome, n in self._released.items() if n},
        )

    # --- internals -------------------------------------------------------------------------------

    def _set_limit(self, limit: int) -> None:
        """Work out every compartment's reserve and reach once per limit, not per decision."""
        self._limit = limit
        specs = self._compartments.specs
        self._guaranteed = {spec.name: spec.guaranteed(limit) for spec in specs}
        self._cap = {spec.name: min(spec.ceiling(limit), limit) for spec in specs}

    def _reguard(self) -> None:
        self._guarded = self._draining or not self._available or self._ceiling is not None

    def _refusal(self, cost: int, name: str, worst: int) -> RejectReason | None:
        if self._draining:
            return "draining"
        if not self._available:
            return "no_capacity"
        if self._ceiling is not None and worst > self._ceiling:
            return "too_large"
        if cost <= self._cap[name]:
            return None
        if self._limit > 0 and self._ceiling is None and cost > 1:
            return "too_large"
        # Cannot run at the present limit; waiting only makes sense if a queue is allowed.
        return "no_capacity" if self._max_queue == 0 else None

    def _evict_oversize(self) -> None:
        """Take out every waiter (of more than one unit) that can never fit under the new caps.

        Adaptive admission (a ``ceiling`` beyond the limit) keeps them: its limit grows back.
        """
        if self._limit == 0 or self._ceiling is not None:
            return
        for waiter in [
            w for w in self._queued_tickets.values() if w.cost > max(1, self._cap[w.compartment])
        ]:
            self._remove_queued(waiter)
            self._rejected["too_large"] += 1
            self._evicted.append(waiter.ticket)

    def _reject(self, reason: RejectReason, name: str, cost: int) -> Rejected:
        self._rejected[reason] += 1
        return Rejected(reason=reason, compartment=name, cost=cost, queued=self.queued)

    def _remove_queued(self, waiter: Waiter) -> None:
        self._queues[waiter.compartment].remove(waiter)
        del self._queued_tickets[waiter.ticket]

    def _fits(self, waiter: Waiter) -> bool:
        """Whether ``waiter`` may run now: room in its compartment and in the whole limit, and a
        free slot under ``max_in_flight``."""
        name, cost = waiter.compartment, waiter.cost
        if self._max_in_flight is not None and len(self._granted) >= self._max_in_flight:
            return False
        return self._used[name] + cost <= self._cap[name] and (
            self._used_total + cost <= self._limit
        )

    def _within_guarantee(self, waiter: Waiter) -> bool:
        return self._used[waiter.compartment] + waiter.cost <= self._guaranteed[waiter.compartment]

    def _grant(self, waiter: Waiter) -> None:
        """Count ``waiter`` as running."""
        self._granted[waiter.ticket] = waiter
        self._used[waiter.compartment] += waiter.cost
        self._used_total += waiter.cost
        self._count[waiter.compartment] += 1
        self._queues[waiter.compartment].hold(waiter.source)
        self._granted_total += 1

    def _pump(self) -> tuple[Granted, ...]:
        """Grant every queue head that fits, oldest first (see the docstring on starvation)."""
        if not self._queued_tickets:
            return ()  # the common release: nobody waits
        if len(self._queues) == 1:
            return self._pump_one()
        granted: list[Granted] = []
        while self._queued_tickets and not self._draining:
            waiter = self._next_grantable()
            if waiter is None:
                break
            self._remove_queued(waiter)
            self._grant(waiter)
            granted.append(Granted(waiter.ticket, waiter.compartment, waiter.cost))
        return tuple(granted)

    def _pump_one(self) -> tuple[Granted, ...]:
        """``_pump`` without compartments: one queue, granted from its head while it fits; no
        borrowing to weigh."""
        queue, granted = self._queues[DEFAULT], []
        if self._draining:
            return ()
        while queue and self._fits(head := queue.head()):
            queue.remove(head)
            del self._queued_tickets[head.ticket]
            self._grant(head)
            granted.append(Granted(head.ticket, DEFAULT, head.cost))
        return tuple(granted)

    def _next_grantable(self) -> Waiter | None:
        # A compartment is as old as its oldest waiter, whoever its head is: a head that waits
        # for room holds back borrowing past any waiter of its compartment.
        queues = sorted((q for q in self._queues.values() if q), key=FairQueue.oldest)
        heads = [q.head() for q in queues]
        owners = {h.compartment for h in heads if self._within_guarantee(h)}
        blocked = False
        for head in heads:
            if self._fits(head):
                if head.compartment in owners:
                    return head
                # A borrower: not past an older waiting head, nor while an owner waits.
                if not blocked and not owners:
                    return head
            elif head.cost <= self._cap[head.compartment]:
                blocked = True  # an older head that can run once room frees: no borrowing past it
        return None
