"""The asyncio bulkhead: ``async with bulkhead.admit(cost) as permit`` over the admission core.

Waiting never blocks the loop: a waiter awaits a future that a release, a resize or its timer
settles. The core decides every race: a timer or a cancel only wins if the core still has the
waiter queued; otherwise the grant won, and a cancelled waiter releases what it was granted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import fields, replace

import structlog

from sidecar.core.admission.compartments import DEFAULT, Compartments
from sidecar.core.admission.decisions import Granted, Hopeless, Outcome, Queued, Rejected
from sidecar.core.admission.frees_forecast import CacheGrowth
from sidecar.core.admission.ledger import Ledger, StreamUsage
from sidecar.core.admission.machine import Admission
from sidecar.core.admission.modes import AdmissionMode, CountMode
from sidecar.core.admission.retry_hint import ReleaseRate
from sidecar.core.errors import AdmissionRejectedError
from sidecar.core.limits import Limits
from sidecar.core.outcomes import ROOM_REFUSALS, RejectReason
from sidecar.limiter.events import AdmissionEvent, BulkheadSnapshot, EventKind
from sidecar.limiter.expiry import CallLater, Expiry
from sidecar.limiter.permit import Permit

log = structlog.get_logger(__name__)


class Bulkhead:
    """Bounded concurrency with a bounded, timed queue per compartment, granted by source: the
    waiter whose source holds fewest places first, oldest first among equals."""

    def __init__(
        self,
        *,
        limit: int,
        max_queue: int,
        max_wait_s: float,
        return_wait_s: float | None = None,
        mode: AdmissionMode | None = None,
        shadow: bool = False,
        max_in_flight: int | None = None,
        compartments: Compartments | None = None,
        clock: Callable[[], float] = time.monotonic,
        call_later: CallLater | None = None,
        on_event: Callable[[AdmissionEvent], None] | None = None,
        hint: ReleaseRate | None = None,
    ) -> None:
        """``mode``: how requests are priced and what can ever run (count mode if None);
        ``return_wait_s``: the longest a caller back as told waits (None: ``max_wait_s``)."""
        self._mode: AdmissionMode = mode or CountMode()
        self._core = Admission(
            limit=limit,
            max_queue=max_queue,
            compartments=compartments,
            max_in_flight=max_in_flight,
            reach=self._mode,
        )
        self._ledger = Ledger()
        self._shadow = shadow
        self._max_wait_s = max_wait_s
        self._return_wait_s = max_wait_s if return_wait_s is None else return_wait_s
        self._max_in_flight = max_in_flight
        self._clock = clock
        self._call_later = call_later
        self.on_event = on_event
        self._hint = hint or ReleaseRate()
        # Queued permits by ticket; each carries its ticket, cost, compartment, when it began to
        # wait and the future its grant settles (None in shadow mode: it runs meanwhile).
        self._waiters: dict[int, Permit] = {}
        self._expiry = (
            Expiry(now=clock, call_later=call_later, expire=self._expire) if call_later else None
        )
        self._expiry_loop: asyncio.AbstractEventLoop | None = None
        self._open = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._pressed = False
        self._turned_away = 0  # refusals for room counted by the last turned_away()
        self._waiting = False  # a waiter is queued: the hint's clock runs
        self._full = False  # every place in flight is held: the hint's frees count

    # --- public ----------------------------------------------------------------------------------

    def admit(
        self,
        cost: int = 1,
        compartment: str = DEFAULT,
        usage: StreamUsage | None = None,
        *,
        may_wait: bool = True,
        max_wait_s: float | None = None,
        returning: bool = False,
        source: str | None = None,
    ) -> Permit:
        """Hold capacity for the body of ``async with``; raises AdmissionRejectedError before it.

        ``may_wait=False``: refused at once (``shed``) unless capacity is free now. Adaptive mode:
        ``usage`` is the request's live footprint; its charge grows while it runs. ``max_wait_s``:
        this request waits no longer than this (the policy's bound for it), nor than the
        bulkhead's own wait. ``returning``: a caller back when a busy answer told it
        (:mod:`sidecar.core.admission.returns`), whose own wait is the bulkhead's for returns.
        ``source``: who sent it (None: the one anonymous source); among the waiters of a
        compartment, the one whose source holds fewest places is granted first
        (:mod:`sidecar.core.admission.fair_queue`).
        """
        permit = Permit(self, cost, compartment, may_wait, usage)
        permit.returning, permit.source = returning, source
        if max_wait_s is not None:
            permit.max_wait_s = max_wait_s
        return permit

    def resize(self, limits: Limits) -> None:
        """New limits, pushed by whoever decided them (the control loop): growing wakes waiters
        now, shrinking revokes nothing; a waiter that can never fit (the mode's ceiling, else the
        new limit) is refused at once (``too_large``). The cap on requests in flight is applied
        first: a larger one wakes waiters now, a smaller one revokes nothing."""
        self._wake(self._core.cap_in_flight(limits.in_flight))
        self.sync()
        grants = self._core.resize(limits.limit)
        for ticket in self._core.refused_oversize():
            self._refuse_waiter(self._waiters.pop(ticket), "too_large")
        self._wake(grants)
        self._track_full()
        self.judge_waiters()

    def set_available(self, available: bool) -> None:
        """False while there is no capacity at all: refuse at once (no_capacity), queued too."""
        for ticket in self._core.set_available(available):
            self._refuse_waiter(self._waiters.pop(ticket), "no_capacity")

    def sync(self) -> None:
        """Charge running streams what they have grown to (adaptive); revokes nothing."""
        for ticket, charge in self._ledger.grown():
            self._core.grow(ticket, charge)

    def drain(self) -> None:
        """Refuse new requests and queued waiters with ``draining``; running work continues."""
        for ticket in self._core.drain():
            self._refuse_waiter(self._waiters.pop(ticket), "draining")

    async def idle(self) -> None:
        """Return once no permit is held (graceful shutdown waits on this after ``drain``)."""
        await self._idle.wait()

    @property
    def in_flight_limit(self) -> int | None:
        """The cap on requests in flight in force (None: none beyond the limit)."""
        return self._core.in_flight_limit

    def expect_cache(self, cache: CacheGrowth | None) -> None:
        """The engine's KV cache as its requests fill it, where it decides who runs (the SLO
        law's drain ceiling; None: the places alone do): the Retry-After forecast counts a
        place where the cache takes one more request (``ReleaseRate.expect_cache``)."""
        self._hint.expect_cache(cache)

    def expect_hold(self, seconds: float | None, quantiles: tuple[float, ...] = ()) -> None:
        """The engine's own mean time a request runs (None: it does not say) and its evenly
        spaced quantiles (where it says how that time is spread): until requests served here
        say how long one holds its place, the Retry-After hint's pace and forecast count them."""
        self._hint.expect_hold(seconds, quantiles)

    def snapshot(self) -> BulkheadSnapshot:
        """Current limit, use, queue and cumulative counters."""
        core = replace(
            self._core.snapshot(),
            ledger_tokens=self._ledger.occupancy(),
            ledger_reserved_tokens=self._ledger.reserved(),
        )
        return BulkheadSnapshot(
            **{f.name: getattr(core, f.name) for f in fields(core)},
            mode=self._mode.name,
            shadow=self._shadow,
            max_in_flight=self._max_in_flight,
        )

    # --- acquiring (the permit's Holder side) ------------------------------------------------

    def take_now(self, permit: Permit) -> asyncio.Future[float] | None:
        """Decide ``permit``: held now (None), refused (raises), or queued (the future its grant
        sets to how long it waited, or its refusal fails with AdmissionRejectedError)."""
        if permit.cost < 0:
            raise ValueError("cost must be >= 0")
        if self._ledger.streams:
            self.sync()
        usage = permit.asked
        decision = self._core.request(
            permit.cost,
            permit.compartment,
            usage.worst() if usage is not None else None,
            may_wait=permit.may_wait,
            source=permit.source,
        )
        if isinstance(decision, Granted):
            self._emit("granted", decision.compartment, decision.cost)
            self._hold(permit, decision.ticket, decision.cost, decision.compartment, 0.0)
            return None
        if isinstance(decision, Rejected):
            self._pressed |= decision.reason in ("queue_full", "shed")  # refused for room
            self._rejected(permit, decision)
            return None
        self._pressed = True  # it waits: the limit binds
        hopeless = None if self._shadow else self._hopeless(decision, self._wait_for(permit))
        if hopeless is not None:
            self._wake(hopeless.granted)
            self._rejected(permit, hopeless.refusal)  # raises: not in shadow mode
        return self._enqueue(permit, decision)

    def _hopeless(self, queued: Queued, max_wait_s: float) -> Hopeless | None:
        """The core's answer for the queued request: refused now where it would wait past
        ``max_wait_s`` (``queue_full``), rather than queued to time out.

        Where only places freeing let it in (:meth:`_frees_owed`), its wait is the forecast's,
        from the ages of those held (:meth:`ReleaseRate.forecast_wait_s`). Else, or where the
        forecast cannot tell, it is estimated once grants to waiters were measured, at the
        faster of them and the pace at which places free (one place lets about one waiter in,
        whatever the unit of cost). Judged by the forecast while slow start still grew the
        places, with no regard for the growth, the GPU-shaped burst let 17 of 96 in at the first
        try where the engine ran 31."""
        now = self._clock()
        wait = self._frees_wait_s(queued.ahead, now)
        if wait is None:
            wait = self._hint.place_wait_s(queued.ahead, now, slots=self._slots())
        return self._core.refuse_hopeless(queued, wait, max_wait_s)

    def _frees_owed(self, ahead: int) -> tuple[int, int | None] | None:
        """Which place in the forecast of frees lets a waiter with ``ahead`` waiters before it
        in, and how many places may be held at once (None: those held now), where only a place
        freeing lets it in; None where the places may still grow to it.

        The places can grow to the cap in flight, or, while the law grows it fast (slow start),
        to its reach (the SLO law's drain ceiling: what the KV cache holds; unbounded where the
        engine does not say). A waiter past what growth brings is owed frees: those of the
        waiters ahead, and as many more as run beyond the reach (the cap fell under them as the
        cache filled). Where the forecast sees the cache fill (``ReleaseRate.expect_cache``),
        it counts those itself, held to the reach: the waiter's place is its queue's."""
        core = self._core
        reach = core.in_flight_limit
        if reach is None:
            return None
        if self._mode.grows_fast(core.limit):
            reach = self._mode.in_flight_reach()
            if reach is None:
                return None
        owed = ahead + core.in_use - reach
        if owed < 0:
            return None
        return (ahead, reach) if self._hint.sees_cache else (owed, None)

    def _frees_wait_s(self, ahead: int, now: float) -> float | None:
        """The forecast's wait for a waiter with ``ahead`` before it, where only places freeing
        let it in (:meth:`_frees_owed`); None where growth may, or the forecast cannot tell."""
        owed = self._frees_owed(ahead)
        return None if owed is None else self._hint.forecast_wait_s(owed[0], now, owed[1])

    def judge_waiters(self) -> None:
        """With each new limit, and each tick of the control loop that left the limits as they
        were (the law's step learnt what the cache holds), the waiters are judged as a newcomer
        is: each that only places freeing can let in (:meth:`_frees_owed`: past what growth
        brings), whose place is forecast to free after its deadline, is refused now
        (``queue_full``, told its place among the refused) rather than left to time out. On the
        GPU-shaped burst the 65 queued behind the 31 places waited out their 1.1-1.4 s before
        the busy answer. They are judged in the order they are to be granted (the core's: by
        source), each with those before it in that order ahead of it."""
        if self._shadow or not self._waiters:
            return
        now, ahead = self._clock(), 0
        for ticket in self._core.grant_order():
            waiter = self._waiters.get(ticket)
            if waiter is None:
                continue  # granted as one judged before it left
            wait = self._frees_wait_s(ahead, now)
            if wait is None or wait <= waiter.started + self._wait_for(waiter) - now:
                ahead += 1
                continue
            withdrawal = self._core.withdraw(ticket, "queue_full")
            if withdrawal.removed:
                self._refuse_waiter(self._waiters.pop(ticket), "queue_full")
            self._wake(withdrawal.granted)
        self._track_queue()

    def _slots(self) -> int:
        """The places the pod runs when full, for the Retry-After hint's pace: the cap in flight,
        or what runs where more run or there is none."""
        core = self._core
        return max(core.in_use, core.in_flight_limit or 0)

    def _wait_for(self, permit: Permit) -> float:
        """The longest ``permit`` may wait: the bulkhead's (for returns, where it is one), or
        less where the request asked."""
        longest = self._return_wait_s if permit.returning else self._max_wait_s
        return longest if permit.max_wait_s is None else min(longest, permit.max_wait_s)

    def waiting(self) -> bool:
        """Whether a request waits for a permit now (a place given up lets one in); never in
        shadow mode, where nobody waits (its queued tickets already run)."""
        return not self._shadow and bool(self._waiters)

    def oldest_wait_s(self) -> float:
        """How long the request queued longest has waited so far; 0 while none waits."""
        oldest = next(iter(self._waiters.values()), None)  # queued in ticket order
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest.started)

    def turned_away(self) -> int:
        """How many requests were refused for room (queue full or hopeless, shed, timed out, no
        capacity) since the last call: demand the limit did not let in."""
        rejected = self._core.snapshot().rejected
        total = sum(rejected.get(reason, 0) for reason in ROOM_REFUSALS)
        new, self._turned_away = total - self._turned_away, total
        return max(0, new)

    def pressed(self) -> bool:
        """Whether the limit bound since the last call: a request waited, waits now, or was
        refused. Adaptive admission grows its limit only then."""
        pressed, self._pressed = self._pressed or self._core.queued > 0, False
        return pressed

    def took(self, permit: Permit, wait_s: float) -> None:
        """The queued ``permit``'s future was set (to how long it waited): it holds the grant."""
        self._hold(permit, permit.ticket, permit.cost, permit.compartment, wait_s)

    def abandoned(self, permit: Permit) -> None:
        """A queued ``permit``'s waiter was cancelled: no trace if still queued, else the grant
        it won in the same tick is given back."""
        ticket = permit.ticket
        assert ticket is not None
        self._forget(ticket)
        self._waiters.pop(ticket, None)
        withdrawal = self._core.withdraw(ticket, "cancelled")
        if not withdrawal.removed:
            self._return_grant(ticket, permit.cost, "cancelled")
        self._wake(withdrawal.granted)
        self._track_queue()

    def _rejected(self, permit: Permit, decision: Rejected) -> None:
        error = self._error(decision.reason, decision.compartment, source=permit.source)
        self._emit(
            "rejected",
            decision.compartment,
            decision.cost,
            reason=decision.reason,
            retry_after_s=error.retry_after_s,
        )
        if not self._shadow or decision.reason == "draining":
            raise error
        self._hold(permit, None, decision.cost, decision.compartment, 0.0)
        permit.shadow_rejected = decision.reason

    def _enqueue(self, permit: Permit, queued: Queued) -> asyncio.Future[float] | None:
        self._emit("queued", queued.compartment, queued.cost)
        ticket = queued.ticket
        loop = asyncio.get_running_loop()
        future = None if self._shadow else loop.create_future()
        # What it waits for is what it will hold: the core's ticket, its cost and compartment.
        permit.queued(ticket, queued.cost, queued.compartment, self._clock(), future)
        if self._shadow:
            # Shadow: run now, but leave the ticket queued so every later decision is the same.
            self._hold(permit, ticket, queued.cost, queued.compartment, 0.0)
        self._waiters[ticket] = permit
        self._deadlines(loop).add(ticket, self._wait_for(permit))
        self._track_queue()
        return future

    def _deadlines(self, loop: asyncio.AbstractEventLoop) -> Expiry:
        """The waiters' deadlines: on the injected timer, else on ``loop`` (the running one).

        On the loop's own time, not ``clock``: that is what its timers fire by.
        """
        if self._call_later is None and self._expiry_loop is not loop:
            self._expiry_loop = loop
            self._expiry = Expiry(now=loop.time, call_later=loop.call_later, expire=self._expire)
        assert self._expiry is not None
        return self._expiry

    def _hold(
        self, permit: Permit, ticket: int | None, cost: int, compartment: str, wait_s: float
    ) -> None:
        """``permit`` holds its grant from now; adaptive: the ledger tracks what it uses."""
        self._open += 1
        self._idle.clear()
        permit.hold(ticket, cost, compartment, wait_s)
        permit.held_at = self._clock()
        if ticket is not None:
            self._hint.holding(ticket, permit.held_at)
        self._track_full()
        usage = permit.asked
        if usage is not None and ticket is not None and self._core.is_granted(ticket):
            permit.usage = usage
            self._ledger.open(ticket, usage, cost)

    # --- settling waiters ------------------------------------------------------------------------

    def _track_queue(self) -> None:
        """Run the Retry-After hint's clock while a waiter is queued, and only then.

        The hint measures how fast waiters get in: each grant to a waiter (``_wake``) over the
        time while one waits (RFC 7661's validated window). Time while nobody waits is time the
        engine was not asked for more, whatever it ran: counted, three streams served before a
        burst made it look as if one start took ten seconds, and the burst was refused as
        hopeless. Releases are not the measure either: under slo a stream's first token frees
        a start for a waiter that is often gone by then (docs/adaptive.md)."""
        waiting = self._core.queued > 0
        if waiting != self._waiting:
            self._waiting = waiting
            (self._hint.busy if waiting else self._hint.idle)(self._clock())

    def _track_full(self) -> None:
        """Run the hint's full clock while every place in flight is held, and only then: the
        places that free then are how fast one frees for a refused caller."""
        core = self._core
        cap = core.in_flight_limit
        full = cap is not None and core.in_use >= cap
        if full != self._full:
            self._full = full
            self._hint.full(self._clock(), full)

    def _wake(self, grants: tuple[Granted, ...], now: float | None = None) -> None:
        if not grants:
            return  # most releases: no clock read
        if now is None:
            now = self._clock()
        for grant in grants:
            waiter = self._waiters.pop(grant.ticket)
            wait_s = now - waiter.started
            self._hint.observe(now, grant.cost)
            self._emit("granted", grant.compartment, grant.cost, wait_s=wait_s)
            self._forget(grant.ticket)
            # A waiter cancelled in this same tick has a cancelled future: it releases on unwind.
            future = waiter.future
            if future is not None and not future.done():
                future.set_result(wait_s)
        self._track_queue()

    def _expire(self, ticket: int) -> None:
        withdrawal = self._core.withdraw(ticket, "timeout")
        if withdrawal.removed:  # else the grant won the race and stands
            self._refuse_waiter(self._waiters.pop(ticket), "timeout")
        self._wake(withdrawal.granted)
        self._track_queue()

    def _refuse_waiter(self, waiter: Permit, reason: RejectReason) -> None:
        assert waiter.ticket is not None
        self._forget(waiter.ticket)
        name, cost = waiter.compartment, waiter.cost
        # The requests still queued came after it: none of them is ahead of it for a place.
        error = self._error(reason, name, waited_s=self._clock() - waiter.started, queued=False)
        self._emit(
            "rejected",
            name,
            cost,
            reason=reason,
            retry_after_s=error.retry_after_s,
            wait_s=error.waited_s,
        )
        future = waiter.future
        if future is None:  # shadow: it runs; what enforcement would have said is recorded
            waiter.shadow_rejected = reason
        elif not future.done():
            future.set_exception(error)
        self._track_queue()

    def _forget(self, ticket: int) -> None:
        if self._expiry is not None:
            self._expiry.discard(ticket)

    def first_token(self, permit: Permit) -> None:
        """``permit``'s stream started: it holds what the mode prices a started stream at from
        now (slo: nothing of the limit on starts; it still counts in flight), and the room lets
        waiters in (each a grant the Retry-After hint counts). Modes that price a stream the
        same throughout do nothing here."""
        ticket = permit.ticket
        if ticket is None:
            return  # a shadow refusal: it holds nothing
        started = self._core.start(ticket, self._mode.started_cost())
        if started is not None:
            permit.cost = started.cost
            self._wake(started.granted)

    def give_back(self, permit: Permit, outcome: Outcome) -> None:
        """Take back what ``permit`` holds; called once per held permit, by its ``release``."""
        if permit.ticket is not None:
            # How long a place is held, and by whom now: Retry-After's pace and forecast.
            self._hint.ended(permit.ticket, self._clock(), served=outcome == "completed")
            self._return_grant(permit.ticket, permit.cost, outcome)
        self._open -= 1
        if self._open == 0:
            self._idle.set()

    def _return_grant(self, ticket: int, cost: int, outcome: Outcome) -> None:
        if self._core.is_granted(ticket):
            if self._ledger.streams:  # adaptive with streams open; else no ledger work at all
                self.sync()
                self._ledger.close(ticket)
            if self._full:
                self._hint.freed(self._clock())
            self._wake(self._core.release(ticket, outcome))
            self._track_full()
        elif self._waiters.pop(ticket, None) is not None:
            # Shadow: the request ran at once and ended before its would-be grant came.
            self._forget(ticket)
            self._wake(self._core.withdraw(ticket, "cancelled").granted)

    # --- reporting -------------------------------------------------------------------------------

    def _error(
        self,
        reason: RejectReason,
        compartment: str,
        waited_s: float = 0.0,
        *,
        queued: bool = True,
        source: str | None = None,
    ) -> AdmissionRejectedError:
        """The refusal of a new request from ``source`` (``queued``: the waiters to be granted
        before it are ahead of it) or of a waiter leaving the queue (nobody queued is ahead of
        it)."""
        if reason == "too_large":
            retry = self._hint.bounds.high_s  # retrying cannot help; say so with the longest hint
        else:
            core = self._core
            need = self._mode.must_drain(core, compartment)
            ahead = core.queued_ahead(compartment, source) if need is None and queued else 0
            owed = self._frees_owed(ahead) if need is None else None  # tokens: their drain
            retry = self._hint.quote(
                ahead if owed is None else owed[0],
                self._clock(),
                tokens=need,
                running=core.in_use,
                slots=self._slots(),
                full=owed is not None,
                places=None if owed is None else owed[1],
            )
        return AdmissionRejectedError(reason, retry, waited_s)

    def _emit(
        self,
        kind: EventKind,
        compartment: str,
        cost: int,
        *,
        wait_s: float = 0.0,
        reason: RejectReason | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        on_event = self.on_event
        if on_event is None:
            return
        event = AdmissionEvent(
            kind=kind,
            compartment=compartment,
            cost=cost,
            shadow=self._shadow,
            queued=self._core.queued,
            wait_s=wait_s,
            reason=reason,
            retry_after_s=retry_after_s,
        )
        try:
            on_event(event)
        except Exception:
            # The observer is metrics/logging: its failure must never corrupt admission state.
            log.exception("admission_observer_failed", kind=kind)
