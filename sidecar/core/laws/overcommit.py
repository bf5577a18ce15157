"""How far adaptive admission may over-commit the KV pool, steered by the engine's own evidence.

The ratio multiplies the admissible pool. A paged engine that is busy and healthy sits near full
KV usage, with a request or two briefly waiting at its queue: that is the state to hold, not a
warning. Thrashing looks different: a preemption (the engine threw away a running request's KV),
KV usage pinned at the top, or requests waiting at the engine tick after tick. So, each tick:

- a new preemption cuts the ratio at once (multiplicative decrease);
- KV usage above the target shrinks it, in proportion to the excess;
- requests waiting at the engine for ``patience`` ticks in a row shrink it a little;
- while the limit binds (someone is waiting or was refused at the sidecar), KV usage is below the
  target, nothing waits at the engine and no preemption came for ``patience`` ticks, it grows by
  a small step;
- otherwise it holds: a limit nobody presses against has no reason to move.

KV usage is smoothed over a few ticks (a single reading moves as streams start and end). Pure: the
control loop feeds it one observation per tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Pressure = Literal["preempted", "kv_high", "engine_waiting"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AimdConfig:
    """Bounds and steps of the ratio.

    ``target``: the KV usage (0..1) to hold the engine at; ``gain``: how much of an excess over
    the target one tick takes back; ``decrease``: the cut on a preemption (half of it for
    requests waiting at the engine); ``increase``: the step up on a tick the limit binds;
    ``patience``: ticks of engine-side waiting tolerated, and calm ticks after a preemption
    before the ratio may grow again; ``smoothing``: the weight of a new KV usage reading in the
    average the ratio is steered by.
    """

    low: float = 0.5
    high: float = 3.0
    start: float = 1.0
    increase: float = 0.05
    decrease: float = 0.8
    target: float = 0.9
    gain: float = 0.25
    patience: int = 5
    smoothing: float = 0.3

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.start <= self.high:
            raise ValueError(
                f"need 0 < low <= start <= high, got {self.low}/{self.start}/{self.high}"
            )
        if self.increase < 0 or not 0 < self.decrease < 1:
            raise ValueError("need increase >= 0 and 0 < decrease < 1")
        if not 0 < self.target <= 1 or self.gain <= 0 or self.patience < 1:
            raise ValueError("need 0 < target <= 1, gain > 0 and patience >= 1")
        if not 0 < self.smoothing <= 1:
            raise ValueError("need 0 < smoothing <= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class OvercommitEvidence:
    """One tick of the engine's numbers (None where the engine does not report it), and whether
    the sidecar's limit bound during the tick (requests waiting or refused for room)."""

    preemptions_total: float | None
    kv_usage_ratio: float | None
    requests_waiting: float | None
    binding: bool = True


class Overcommit:
    """The controller's state: the ratio now, the preemption count it last saw, waiting ticks."""

    def __init__(self, config: AimdConfig | None = None) -> None:
        self.config = config or AimdConfig()
        self.ratio = self.config.start
        self.last_pressure: Pressure | None = None
        self._preemptions: float | None = None
        self._waiting_ticks = 0
        self._calm_ticks = self.config.patience  # ticks since the last preemption
        self.usage: float | None = None  # KV usage, smoothed over the last few ticks

    def observe(self, evidence: OvercommitEvidence) -> float:
        """Step the ratio on one tick's evidence; returns the new ratio."""
        config = self.config
        usage = self._smooth(evidence.kv_usage_ratio)
        pressure = self._pressure(evidence, usage)
        self.last_pressure = pressure
        if pressure == "preempted":
            factor = config.decrease
        elif pressure == "kv_high" and usage is not None:
            factor = 1 - config.gain * (usage - config.target)
        elif pressure == "engine_waiting":
            factor = 1 - (1 - config.decrease) / 2
        elif not self._may_grow(evidence):
            factor = 1.0
        else:
            # Up by a small step only: KV usage lags admissions (a new stream holds little at
            # first), so a step sized by today's gap overshoots into preemptions a few s later.
            self.ratio = min(config.high, self.ratio + config.increase)
            return self.ratio
        self.ratio = min(config.high, max(config.low, self.ratio * factor))
        return self.ratio

    def _may_grow(self, evidence: OvercommitEvidence) -> bool:
        """Only while the limit binds, the engine takes what it is sent, and no preemption came
        for ``patience`` ticks."""
        return (
            evidence.binding
            and not evidence.requests_waiting
            and self._calm_ticks >= self.config.patience
        )

    def _smooth(self, reading: float | None) -> float | None:
        """One sample is noisy (streams start and end between ticks): an exponential average."""
        if reading is None or self.usage is None:
            self.usage = reading
        else:
            self.usage += self.config.smoothing * (reading - self.usage)
        return self.usage

    def _pressure(self, evidence: OvercommitEvidence, usage: float | None) -> Pressure | None:
        seen, self._preemptions = self._preemptions, evidence.preemptions_total
        now = evidence.preemptions_total
        waiting = evidence.requests_waiting
        self._waiting_ticks = self._waiting_ticks + 1 if waiting else 0
        self._calm_ticks += 1
        if seen is not None and now is not None and now > seen:
            self._calm_ticks = 0
            return "preempted"
        if usage is not None and usage > self.config.target:
            return "kv_high"
        if self._waiting_ticks >= self.config.patience:
            return "engine_waiting"
        return None
