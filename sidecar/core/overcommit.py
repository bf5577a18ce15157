"""How far adaptive admission may over-commit the KV pool: AIMD driven by the engine's evidence.

The ratio multiplies the admissible pool. Any sign of pressure at the engine (a new preemption,
KV usage above the high watermark, requests waiting in the engine's own queue) cuts it at once
(multiplicative decrease); each healthy tick adds a little back (additive increase). Pure: the
control loop feeds it one observation per tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Pressure = Literal["preempted", "kv_high", "engine_waiting"]


@dataclass(frozen=True, slots=True)
class AimdConfig:
    """Bounds and steps of the ratio; ``high_watermark`` is the KV usage (0..1) that counts."""

    low: float = 0.5
    high: float = 3.0
    start: float = 1.0
    increase: float = 0.05
    decrease: float = 0.9
    high_watermark: float = 0.95

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.start <= self.high:
            raise ValueError(
                f"need 0 < low <= start <= high, got {self.low}/{self.start}/{self.high}"
            )
        if self.increase < 0 or not 0 < self.decrease < 1:
            raise ValueError("need increase >= 0 and 0 < decrease < 1")


@dataclass(frozen=True, slots=True)
class EngineEvidence:
    """One tick of the engine's numbers; None where the engine does not report it."""

    preemptions_total: float | None
    kv_usage_ratio: float | None
    requests_waiting: float | None


class Overcommit:
    """The AIMD state: the ratio now, and the preemption count it last saw."""

    def __init__(self, config: AimdConfig | None = None) -> None:
        self.config = config or AimdConfig()
        self.ratio = self.config.start
        self.last_pressure: Pressure | None = None
        self._preemptions: float | None = None

    def observe(self, evidence: EngineEvidence) -> float:
        """Step the ratio on one tick's evidence; returns the new ratio."""
        pressure = self._pressure(evidence)
        config = self.config
        if pressure is None:
            self.ratio = min(config.high, self.ratio + config.increase)
        else:
            self.ratio = max(config.low, self.ratio * config.decrease)
        self.last_pressure = pressure
        return self.ratio

    def _pressure(self, evidence: EngineEvidence) -> Pressure | None:
        seen, self._preemptions = self._preemptions, evidence.preemptions_total
        now = evidence.preemptions_total
        if seen is not None and now is not None and now > seen:
            return "preempted"
        usage = evidence.kv_usage_ratio
        if usage is not None and usage > self.config.high_watermark:
            return "kv_high"
        if evidence.requests_waiting is not None and evidence.requests_waiting > 0:
            return "engine_waiting"
        return None
