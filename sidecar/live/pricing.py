"""Whether a closed-loop mode (slo, adaptive) may steer by the engine's evidence, or must price
the worst case: one verdict for both laws, from whether the engine was seen and exports a
preemption counter (an engine without one may fail on overflow instead of preempting)."""

from __future__ import annotations

from typing import Literal

from sidecar.core.warnings import ConfigWarning, adaptive_unsupported
from sidecar.live.probes import EngineReading

NO_ENGINE = "no engine metrics to watch (capacity source without the engine)"
NO_PREEMPTION_SERIES = (
    "the engine exports no preemption counter (vllm:num_preemptions_total, "
    "sglang:num_retracted_requests_total)"
)


class PricingVerdict:
    """The verdict now: ``unsupported`` says why the mode prices the worst case (None: it steers).

    ``steered``: what the mode's reason says while it steers; ``without_preemption``: what its
    fallback means for it, after the missing counter."""

    def __init__(
        self, *, mode: Literal["slo", "adaptive"], steered: str, without_preemption: str
    ) -> None:
        self.mode = mode
        self.steered = steered
        self.no_preemption = f"{NO_PREEMPTION_SERIES}: {without_preemption}"
        self.unsupported: str | None = NO_ENGINE

    @property
    def pricing(self) -> str:
        """closed-loop (steered by the engine's evidence) or worst-case (nothing to steer by)."""
        return "worst-case" if self.unsupported else "closed-loop"

    @property
    def reason(self) -> str:
        return self.unsupported or self.steered

    @property
    def engine_seen(self) -> bool:
        return self.unsupported != NO_ENGINE

    def hear(self, engine: EngineReading) -> bool:
        """The engine's reading; True where the verdict changed (the caller logs it)."""
        reason = self.no_preemption if engine.preemptions_total is None else None
        changed = reason != self.unsupported
        self.unsupported = reason
        return changed

    def warnings(self) -> tuple[ConfigWarning, ...]:
        """The adaptive_unsupported warning while the mode prices the worst case."""
        return (adaptive_unsupported(self.unsupported, self.mode),) if self.unsupported else ()
