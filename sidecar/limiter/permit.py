"""What the bulkhead hands out: a permit, which is also the ``async with`` that acquires it and
releases it, exactly once, with the outcome of the body it guarded."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Literal, Protocol

from sidecar.core.decisions import Outcome
from sidecar.core.ledger import StreamUsage
from sidecar.core.outcomes import RejectReason

State = Literal["asked", "held", "released"]


class Holder(Protocol):
    """The side that decides and takes back permits (the bulkhead)."""

    def take_now(self, permit: Permit) -> asyncio.Future[float] | None:
        """Grant ``permit`` now (None), raise AdmissionRejectedError, or queue it: then a future
        that its grant sets (to how long it waited) or its refusal fails."""

    def took(self, permit: Permit, wait_s: float) -> None:
        """The queued ``permit`` was granted after waiting ``wait_s``: it holds it from now."""

    def abandoned(self, permit: Permit) -> None:
        """The queued ``permit``'s waiter was cancelled: withdrawn, or its grant given back."""

    def give_back(self, permit: Permit, outcome: Outcome) -> None:
        """Take back what ``permit`` holds; called once per held permit."""


class Permit:
    """A grant held by one request, from ``async with`` to its end; released exactly once (a
    second release, or a release of a permit never granted, does nothing).

    One object is both the context and the grant: this runs once per request, and a separate
    context object cost ~0.3 us more (docs/performance.md), as a generator-based one cost ~2 us.
    ``cost`` and ``compartment`` are what was asked until it is decided, then what was (or, while
    queued, will be) granted.
    ``usage`` is the request's live footprint (adaptive admission), set once it runs.
    """

    __slots__ = (
        "_asked",
        "_future",
        "_holder",
        "_may_wait",
        "_started",
        "_state",
        "_ticket",
        "compartment",
        "cost",
        "outcome",
        "shadow_rejected",
        "usage",
        "wait_s",
    )

    _started: float
    _future: asyncio.Future[float] | None

    def __init__(
        self,
        holder: Holder,
        cost: int,
        compartment: str,
        may_wait: bool = True,
        usage: StreamUsage | None = None,
    ) -> None:
        self.cost, self.compartment, self.wait_s = cost, compartment, 0.0
        self.usage: StreamUsage | None = None
        self.outcome: Outcome | None = None
        self.shadow_rejected: RejectReason | None = None
        self._holder, self._may_wait, self._asked = holder, may_wait, usage
        self._ticket: int | None = None
        self._state: State = "asked"
        # ``_started`` and ``_future`` are set only if it queues (by the holder): when it began
        # to wait, and the future its grant settles. Most requests never queue, and two more
        # stores here cost every one of them ~500 instructions (callgrind).

    def __repr__(self) -> str:
        return (
            f"Permit(cost={self.cost}, compartment={self.compartment!r}, wait_s={self.wait_s}, "
            f"state={self._state!r}, outcome={self.outcome!r})"
        )

    def release(self, outcome: Outcome | None = None) -> None:
        """Give the capacity back with ``outcome`` (default: ``self.outcome``, else completed)."""
        if self._state != "held":
            return
        self._state = "released"
        self._holder.give_back(self, outcome or self.outcome or "completed")

    async def __aenter__(self) -> Permit:
        # Decided without a second coroutine, and a queued request awaits its grant right here:
        # a coroutine more to wait in cost ~1.2k instructions per queued request (callgrind).
        waiting = self._holder.take_now(self)
        if waiting is not None:
            try:
                wait_s = await waiting
            except asyncio.CancelledError:
                self._holder.abandoned(self)
                raise
            self._holder.took(self, wait_s)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.release()
        elif issubclass(exc_type, asyncio.CancelledError):
            self.release("cancelled")
        else:
            self.release("failed")
