"""The admission core's vocabulary: its decisions, withdrawals and snapshots, as plain values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sidecar.core.outcomes import Outcome as PermitOutcome
from sidecar.core.outcomes import RejectReason

Outcome = PermitOutcome  # how a permit is given back; declared with the tables of how requests end
Mode = Literal["count", "tokens", "adaptive", "slo"]  # the unit costs and limits are counted in
# What one unit of each mode's limit is: a permit per sequence (`n` counts each: count), a stream
# admitted and not yet at its first token (slo), KV bytes of worst-case reservations, or tokens
# held and expected (adaptive).
LIMIT_UNITS: dict[Mode, str] = {
    "count": "sequences",
    "tokens": "kv_bytes",
    "adaptive": "tokens",
    "slo": "starting_streams",
}
WithdrawReason = Literal["timeout", "cancelled", "draining", "queue_full"]


@dataclass(frozen=True, slots=True)
class Granted:
    """The request may run now; ``ticket`` must be released exactly once."""

    ticket: int
    compartment: str
    cost: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Queued:
    """The request waits; ``ahead`` requests of its compartment are before it."""

    ticket: int
    compartment: str
    cost: int
    ahead: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """The request is refused at once."""

    reason: RejectReason
    compartment: str
    cost: int
    queued: int


Decision = Granted | Queued | Rejected


@dataclass(frozen=True, slots=True)
class Withdrawal:
    """``removed``: the waiter was still queued (False: the grant won, or it was gone already).

    ``granted``: waiters its leaving lets in (a blocked head gone frees later borrowers).
    """

    removed: bool
    granted: tuple[Granted, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CompartmentSnapshot:
    """One compartment's reserve, ceiling and current use."""

    name: str
    guaranteed: int
    ceiling: int
    in_use: int
    in_use_cost: int
    queued: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionSnapshot:
    """The whole state machine at one moment, with cumulative counters."""

    limit: int
    in_use: int
    in_use_cost: int
    queued: int
    draining: bool
    compartments: tuple[CompartmentSnapshot, ...]
    granted_total: int
    queued_total: int
    rejected: dict[str, int]
    released: dict[str, int]


class UnknownTicketError(KeyError):
    """A ticket released twice, or never granted: a bug in the caller, never a client's fault."""
