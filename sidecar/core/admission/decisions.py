"""The admission core's vocabulary: its decisions, withdrawals and snapshots, as plain values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sidecar.core.outcomes import Outcome as PermitOutcome
from sidecar.core.outcomes import RejectReason

Outcome = PermitOutcome  # how a permit is given back; declared with the tables of how requests end
Mode = Literal["count", "tokens", "adaptive", "slo"]  # the unit costs and limits are counted in


@dataclass(frozen=True, slots=True, kw_only=True)
class ModeTraits:
    """What hangs off an admission mode wherever its limit is shown, declared once per mode:
    ``unit``, what one unit of its limit is; ``limit_is_worst_case``, the limit is the plan's
    worst-case permits; ``counts_requests``, it counts requests or streams (not bytes or tokens);
    ``reserves_kv_bytes``, it is KV bytes reserved at each request's worst case;
    ``limits_starts``, it counts streams starting, with a cap on requests in flight beside it;
    ``note``: how ``sidecar probe`` qualifies the limit beside the plan's permits."""

    unit: str
    limit_is_worst_case: bool = False
    counts_requests: bool = False
    reserves_kv_bytes: bool = False
    limits_starts: bool = False
    note: str = " (the permits above are not enforced in this mode)"


# A permit per sequence (`n` counts each: count), a stream admitted and not yet at its first token
# (slo), KV bytes of worst-case reservations, or tokens held and expected (adaptive).
MODES: dict[Mode, ModeTraits] = {
    "count": ModeTraits(unit="sequences", limit_is_worst_case=True, counts_requests=True, note=""),
    "tokens": ModeTraits(unit="kv_bytes", reserves_kv_bytes=True),
    "adaptive": ModeTraits(unit="tokens"),
    "slo": ModeTraits(
        unit="starting_streams",
        counts_requests=True,
        limits_starts=True,
        note=" (steered by the streams' latencies; never past the permits above unless the "
        "engine preempts)",
    ),
}
LIMIT_UNITS: dict[Mode, str] = {mode: traits.unit for mode, traits in MODES.items()}
WithdrawReason = Literal["timeout", "cancelled", "draining", "queue_full"]


@dataclass(frozen=True, slots=True)
class Granted:
    """The request may run now; ``ticket`` must be released exactly once."""

    ticket: int
    compartment: str
    cost: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Queued:
    """The request waits; ``ahead`` requests of its compartment are to be granted before it, as
    things stand (the order by source: ``sidecar.core.admission.fair_queue``)."""

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
class Hopeless:
    """A request just queued whose estimated wait is past what it may wait, taken out of its
    queue: ``refusal`` (queue_full) is its answer now, rather than a timeout later;
    ``granted``: the waiters its leaving lets in."""

    refusal: Rejected
    granted: tuple[Granted, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    """A running stream's first token came and it holds less from now: ``cost``, what it holds;
    ``granted``: the waiters the room lets in."""

    cost: int
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
    ledger_tokens: int = 0  # adaptive: what running streams hold now, as relayed
    ledger_reserved_tokens: int = 0  # adaptive: what they are charged (held + expected growth)


class UnknownTicketError(KeyError):
    """A ticket released twice, or never granted: a bug in the caller, never a client's fault."""
