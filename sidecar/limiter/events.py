"""What the bulkhead reports: one event per decision, and its snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sidecar.core.admission.decisions import AdmissionSnapshot, Mode
from sidecar.core.outcomes import RejectReason

EventKind = Literal["granted", "queued", "rejected"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionEvent:
    """One decision, for metrics and logs: granted (wait_s), queued, rejected (reason)."""

    kind: EventKind
    compartment: str
    cost: int
    shadow: bool
    queued: int
    wait_s: float = 0.0
    reason: RejectReason | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkheadSnapshot(AdmissionSnapshot):
    """The core's snapshot plus how the bulkhead enforces it; counters are cumulative."""

    mode: Mode
    shadow: bool
    max_in_flight: int | None
