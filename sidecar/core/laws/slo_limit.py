"""The SLO-steered concurrency limit: how many requests the engine should run, from how the
relayed streams meet their latency objectives. Pure: evidence in, a limit out.

A gradient controller in the manner of Envoy's adaptive concurrency filter and Netflix's
Gradient2, with the reference latency set by the objectives instead of a measured minimum:

- every stream is a sample: its time to first token at the engine over its TTFT target (the
  share of its TTFT objective the engine may use; the sidecar's queue gets the rest), and, once
  it completed, its mean time per output token over its TPOT objective. 1.0 is on target.
- each step takes the ``quantile`` (p90) of each kind of sample gathered since the last one
  (TTFT and TPOT apart, so that many fast tokens cannot hide slow starts), a gradient from
  each, and the smaller of the two, clamped to ``[min_gradient, top]``: for TTFT ``aim / p90``;
  for TPOT ``aim / p90`` below the aim, 1 between the aim and the objective, ``1 / p90`` past
  the objective (``_tpot_gradient`` says why);
- while the limit binds (requests waited or were refused for room since the last step),
  ``limit x gradient``, and at least one more where the gradient is above 1: the engine has
  room to do better. ``top`` is ``slow_start_gradient`` in slow start (x2: a fresh pod finds
  the engine's size in a few ticks), where the limit also reaches for the demand (requests in
  flight and waiting), up to ``slow_start_reach`` x the limit and no further than that demand
  (a burst on a fresh pod is let in on the first tick whose streams are healthy, not refused
  while the limit doubles), and never past what the engine's KV cache holds at the present mix
  (``fits``: running over KV usage, where that usage says anything); slow start ends with the
  first cut, and ``top`` is ``max_gradient``, the streams alone judging;
- while it does not bind, only ``min(gradient, 1)``: a limit nobody presses against has no
  reason to grow; nor where late first tokens judge it (``ttft_judges``) and none came since
  the last step (TPOT alone cannot say that a queue a cut left behind has drained);
- slow first tokens cut only while requests wait at the engine: without a queue there, TTFT is
  the engine's own compute (a slow prefill, a busy CPU), which fewer requests would not shorten;
  then only TPOT speaks, and a limit that binds grows (the engine must not idle while the
  sidecar holds requests);
- fewer than ``min_samples`` samples: the decision waits for more (they are kept, and so are
  whether the limit was pressed meanwhile and the most demand seen meanwhile);
- a limit nobody pressed against for ``restart_after_s`` (no request waited or was refused,
  and at most half of it in use) was not validated by use, so it is no evidence of what the
  engine serves now (RFC 7661, TCP's congestion window validation): slow start begins again,
  from at least where a fresh pod starts (``start``). A burst on a warm pod then fares as on a
  fresh one, whatever light use or an earlier cut left behind;
- always within ``[floor, ceiling]``.

docs/adaptive.md states the same law with its constants; tests/test_law_statement.py holds the
two together.

The engine's insides (preemptions, its queue) enter only through what they cost the streams: a
preemption that costs one cheap step leaves the latencies, and so the limit, alone. KV usage
enters only as ``fits``, a count of the requests the cache holds, never as a share to keep under.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class SloLimitConfig:
    """The controller's constants.

    ``engine_share``: the part of a TTFT objective the engine's own TTFT is steered to (the
    queue at the sidecar may use the rest); ``aim``: the quantile of samples is steered to this
    fraction of the target (headroom for the swings between updates).
    """

    floor: int = 1
    ceiling: int = 4096
    engine_share: float = 0.5
    aim: float = 0.8
    quantile: float = 0.9
    min_gradient: float = 0.5
    max_gradient: float = 1.25
    slow_start_gradient: float = 2.0
    slow_start_reach: float = 4.0
    min_samples: int = 3
    restart_after_s: float = 5.0

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got {self.floor}/{self.ceiling}")
        if not (0 < self.engine_share <= 1 and 0 < self.aim <= 1 and 0 < self.quantile <= 1):
            raise ValueError("need engine_share, aim and quantile in (0, 1]")
        if not 0 < self.min_gradient <= 1 <= self.max_gradient <= self.slow_start_gradient:
            raise ValueError("need 0 < min_gradient <= 1 <= max_gradient <= slow_start_gradient")
        if self.slow_start_reach < self.slow_start_gradient:
            raise ValueError("need slow_start_reach >= slow_start_gradient")
        if self.min_samples < 1:
            raise ValueError("need min_samples >= 1")
        if not self.restart_after_s > 0:
            raise ValueError("need restart_after_s > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitEvidence:
    """What one update hears.

    ``ttft``, ``tpot``: each stream's TTFT and TPOT since the last update over their targets
    (1.0 = on target); ``pressed``: the limit bound (a request waited or was refused for room);
    ``ttft_judges``: requests wait at the engine for what this limit gives, so that fewer would
    start sooner (True where the engine does not say): late first tokens cut it, and without a
    first token since the last step it holds; ``demand``: requests in flight and waiting for a
    permit now; ``fits``: requests the engine's KV cache holds at the present mix (None where
    it cannot tell); ``now``: the time of the update (seconds, any origin; None: no restarts);
    ``start``: where a fresh pod would start the limit now (None: where it stands)."""

    ttft: tuple[float, ...]
    tpot: tuple[float, ...] = ()
    pressed: bool
    ttft_judges: bool = True
    demand: int = 0
    fits: int | None = None
    now: float | None = None
    start: int | None = None


def fits_in_cache(running: float | None, kv_usage: float | None, least: float = 0.05) -> int | None:
    """How many requests like the ones running now the engine's KV cache holds: ``running`` over
    the share of the cache they use; None where the engine does not say, or uses under ``least``
    of it (too few tokens to tell: a cold cache holds anything)."""
    if running is None or kv_usage is None or running < 1 or not least <= kv_usage <= 1:
        return None
    return math.floor(running / kv_usage)


def prompts_fit(
    pool_tokens: int, prompt_tokens: float | None, block_size: int | None
) -> int | None:
    """How many requests the KV cache holds at their start: ``pool_tokens`` over a prompt of
    ``prompt_tokens`` in whole blocks (the engine's typical prompt). What the cache will say
    once they run, before it says (a cold cache); None where the prompt is not known."""
    if prompt_tokens is None or not math.isfinite(prompt_tokens) or prompt_tokens <= 0:
        return None
    block = block_size or 1
    held = math.ceil(prompt_tokens / block) * block
    return max(1, math.floor(pool_tokens / held))


def drain_allowance(held: int, ends_per_s: float, wait_s: float) -> int:
    """Requests in flight the engine's KV cache allows: the ``held`` it holds at the present
    mix, and those the streams ending at ``ends_per_s`` make room for within ``wait_s`` (Little's
    law: no more waiting at the engine than start within ``wait_s``). At least one, so that an
    idle engine is never shut; no waiter beyond ``held`` where nothing ends (it would wait for
    the next end, where one arriving after that end starts at once)."""
    pace = ends_per_s if math.isfinite(ends_per_s) and ends_per_s > 0 else 0.0
    return max(1, math.floor(max(0, held) + pace * max(0.0, wait_s)))


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; ``values`` not empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class SloLimit:
    """The limit now, and the samples still waiting for a decision."""

    def __init__(self, initial: int, config: SloLimitConfig | None = None) -> None:
        self.config = config or SloLimitConfig()
        self._limit = float(self._bounded(initial))
        self._pending: tuple[list[float], list[float]] = ([], [])
        self._pressed = False  # the limit bound on some update since the last step
        self._demand = 0  # the most requests seen wanting to run on an update since then
        self.last_gradient: float | None = None  # None until a decision was made
        self.slow_start = True  # until the first cut; again after a quiet spell
        self._quiet_since: float | None = None  # nobody pressed since then

    @property
    def limit(self) -> int:
        return math.floor(self._limit)

    def restart(self, initial: int) -> None:
        """Start again from ``initial`` (the engine changed), forgetting pending samples."""
        self._limit = float(self._bounded(initial))
        self._pending = ([], [])
        self._pressed, self._demand = False, 0

    def update(self, evidence: LimitEvidence) -> int:
        """One step on ``evidence``; returns the new limit."""
        config = self.config
        self._restart_when_quiet(evidence)
        for pending, samples in zip(self._pending, (evidence.ttft, evidence.tpot), strict=True):
            pending.extend(s for s in samples if s >= 0 and math.isfinite(s))
        # Pressure waits for a step with the samples: a tick too short of samples to step must
        # not leave the next step deaf to the limit having bound.
        pressed = self._pressed = self._pressed or evidence.pressed
        # So does the demand: on a fresh pod at one in flight, a queue is turned away between
        # the ticks that bring a step its samples, and a slow start that reached only for the
        # step's own tick found one request to run (8 users held at 1 for 25 s).
        demand = self._demand = max(self._demand, evidence.demand)
        if sum(map(len, self._pending)) < config.min_samples:
            return self.limit
        ttft, tpot = self._pending
        self._pending, self._pressed, self._demand = ([], []), False, 0
        top = config.slow_start_gradient if self.slow_start else config.max_gradient
        gradient = min(self._ttft_gradient(ttft, evidence, top), self._tpot_gradient(tpot, top))
        gradient = min(top, max(config.min_gradient, gradient))
        if gradient < 1:
            self.slow_start = False
        if not pressed or (evidence.ttft_judges and not ttft):
            # Nobody presses, or requests wait at the engine and no first token says how long:
            # the limit holds (a queue a cut left behind must drain before it may grow again).
            gradient = min(gradient, 1.0)
        self.last_gradient = gradient
        grown = self._limit * gradient
        if gradient > 1:
            grown = max(grown, self._limit + 1)
            if self.slow_start:
                grown = max(grown, min(demand, self._limit * config.slow_start_reach))
                if demand > 0:  # no further than there are requests to run
                    grown = max(self._limit, min(grown, demand))
                if evidence.fits is not None:  # slow start stops where the cache is full
                    grown = max(self._limit, min(grown, evidence.fits))
        self._limit = float(self._bounded(grown))
        return self.limit

    def _ttft_gradient(self, ttft: list[float], evidence: LimitEvidence, top: float) -> float:
        """``aim`` over the TTFT samples' quantile, where late first tokens judge this limit."""
        if not ttft or not evidence.ttft_judges:
            return top
        observed = quantile(ttft, self.config.quantile)
        return top if observed <= 0 else self.config.aim / observed

    def _tpot_gradient(self, tpot: list[float], top: float) -> float:
        """Grow below ``aim``, hold between it and the objective, cut only past the objective
        (to bring the quantile back to it). Time per token grows slowly with the requests a
        decode batch runs (each step reads the weights once for all of them), so steering its
        quantile to ``aim`` like a queue's latency held the engine to about half of what it
        serves within the objectives (the GPU-shaped engine of docs/lab/burst.md)."""
        if not tpot:
            return top
        observed = quantile(tpot, self.config.quantile)
        if observed <= 0:
            return top
        if observed > 1.0:
            return 1.0 / observed
        return max(1.0, self.config.aim / observed)

    def _restart_when_quiet(self, evidence: LimitEvidence) -> None:
        """Slow start again, from at least ``evidence.start``, once nobody pressed against the
        limit for ``restart_after_s`` (see the module's docstring)."""
        now = evidence.now
        if now is None or evidence.pressed or evidence.demand * 2 > self._limit:
            self._quiet_since = None
            return
        if self._quiet_since is None:
            self._quiet_since = now
        if now - self._quiet_since < self.config.restart_after_s:
            return
        self.slow_start = True
        if evidence.start is not None:
            self._limit = float(self._bounded(max(self._limit, evidence.start)))

    def reach_start(self, start: int) -> None:
        """In slow start, at least ``start`` (where a fresh pod starts now): a start made before
        anything said what a typical request holds is lifted once something does."""
        if self.slow_start:
            self._limit = float(self._bounded(max(self._limit, start)))

    def hold_within(self, most: int) -> None:
        """No more than ``most`` (another limit this one lives inside: the starts within the
        requests in flight), never below the floor."""
        self._limit = float(self._bounded(min(self._limit, most)))

    def _bounded(self, value: float) -> float:
        return min(float(self.config.ceiling), max(float(self.config.floor), value))
