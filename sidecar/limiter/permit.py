"""What the bulkhead hands out: a permit, which is also the ``async with`` that acquires it and
releases it, exactly once, with the outcome of the body it guarded."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Literal, Protocol

from sidecar.core.admission.decisions import Outcome
from sidecar.core.admission.ledger import StreamUsage
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

    def first_token(self, permit: Permit) -> None:
        """The held ``permit``'s stream has started: it may now hold less (the mode says)."""


class Permit:
    """A grant held by one request, from ``async with`` to its end; released exactly once (a
    second release, or a release of a permit never granted, does nothing).

    One object is both the context and the grant, as asyncio's own locks are. ``cost`` and
    ``compartment`` are what was asked until it is decided, then what was (or, while queued, will
    be) granted. ``source`` is who sent it (the grant order by source). ``asked`` is the
    request's live footprint as given (adaptive admission); ``usage`` is that footprint once the
    ledger tracks it. ``ticket``, ``started`` and ``future`` are the holder's: the core's ticket,
    and, while queued, when it began to wait and the future its grant settles (None in shadow
    mode).
    """

    __slots__ = (
        "_holder",
        "_state",
        "asked",
        "compartment",
        "cost",
        "future",
        "held_at",
        "max_wait_s",
        "may_wait",
        "outcome",
        "returning",
        "shadow_rejected",
        "source",
        "started",
        "ticket",
        "usage",
        "wait_s",
    )

    def __init__(
        self,
        holder: Holder,
        cost: int,
        compartment: str,
        may_wait: bool = True,
        usage: StreamUsage | None = None,
    ) -> None:
        self.cost, self.compartment, self.wait_s = cost, compartment, 0.0
        self.may_wait, self.asked = may_wait, usage
        self.usage: StreamUsage | None = None
        self.outcome: Outcome | None = None
        self.shadow_rejected: RejectReason | None = None
        self.ticket: int | None = None
        self.started = 0.0
        self.held_at = 0.0  # when it began to hold its grant (the bulkhead's clock)
        self.future: asyncio.Future[float] | None = None
        self.max_wait_s: float | None = None  # a shorter wait than the bulkhead's, where asked
        self.returning = False  # a caller back as told: the bulkhead's wait for returns
        self.source: str | None = None  # who sent it; None: the one anonymous source
        self._holder = holder
        self._state: State = "asked"

    def __repr__(self) -> str:
        return (
            f"Permit(cost={self.cost}, compartment={self.compartment!r}, wait_s={self.wait_s}, "
            f"state={self._state!r}, outcome={self.outcome!r})"
        )

    def queued(
        self,
        ticket: int,
        cost: int,
        compartment: str,
        started: float,
        future: asyncio.Future[float] | None,
    ) -> None:
        """Waiting, from ``started``, for the grant of ``ticket``: ``cost`` in ``compartment``;
        ``future`` is what the grant will settle (None: it runs meanwhile, shadow mode)."""
        self.ticket, self.cost, self.compartment = ticket, cost, compartment
        self.started, self.future = started, future

    def hold(self, ticket: int | None, cost: int, compartment: str, wait_s: float) -> None:
        """Holding ``cost`` in ``compartment`` from now (``ticket`` None: a shadow refusal's)."""
        self.ticket, self.cost, self.compartment, self.wait_s = ticket, cost, compartment, wait_s
        self._state = "held"

    def first_token(self) -> None:
        """The request's first token came (its stream started): where the admission mode prices
        a started stream lower (slo's start gate), the difference comes back now, letting the
        next request start. Nothing once released, or before it is held."""
        if self._state == "held":
            self._holder.first_token(self)

    def release(self, outcome: Outcome | None = None) -> None:
        """Give the capacity back with ``outcome`` (default: ``self.outcome``, else completed)."""
        if self._state != "held":
            return
        self._state = "released"
        self._holder.give_back(self, outcome or self.outcome or "completed")

    async def __aenter__(self) -> Permit:
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
