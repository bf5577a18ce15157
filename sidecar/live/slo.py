"""The default admission's moving parts: the relayed streams' latencies against their objectives,
gathered between control-loop ticks, the engine's verdict and figures, and each tick's ``Tick`` to
the pure law (``sidecar.core.laws.slo_law``), whose ``Step`` is logged here as it is.

The law decides (which evidence each limit hears, the drain ceiling, where the limits start, what
caps them); this module only gathers: each stream's first token (or how late it runs), its pace
once it completed, the streams that ended, the engine's typical request, and whether it preempts.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from sidecar.core.admission.frees_forecast import CacheGrowth
from sidecar.core.laws.slo_law import SloLaw, Step, Tick, max_wait_s, start_limit
from sidecar.core.laws.slo_limit import SloLimit, SloLimitConfig, prompts_fit, quantile
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import Plan
from sidecar.core.request.claims import Claims
from sidecar.core.request.objectives import Objectives, objectives_of
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.core.warnings import ConfigWarning
from sidecar.live.pricing import PricingVerdict
from sidecar.live.probes import EngineReading
from sidecar.live.sources import Readings

log = structlog.get_logger("sidecar.live.slo")

STEERED = "the limit follows the streams' TTFT and TPOT against their objectives"
WITHOUT_PREEMPTION = "it may fail on overflow, so the limit never passes the worst-case permits"
# Weight of a new tick's p90 engine TTFT in the expected TTFT that bounds the queue wait.
TTFT_SMOOTHING = 0.5
# Streams that ended in the last this many seconds give the pace at which a full cache frees.
ENDS_WINDOW_S = 5.0


# The most samples of each kind kept between two steps, the newest: while no plan has started
# the law (a capacity source that never answers) they wait for it, and must not grow without end.
# A quantile over 4,096 samples is as good as over more; more streams than that rarely end in a
# tick (the law's ceiling is 4,096 in flight).
MAX_SAMPLES = 4096


def _samples() -> deque[float]:
    return deque(maxlen=MAX_SAMPLES)


@dataclass(slots=True)
class _Tracked:
    objectives: Objectives
    sampled: bool = False  # its TTFT is in the samples

    def target(self, engine_share: float) -> float:
        """The engine's share of its TTFT objective."""
        return self.objectives.ttft_s * engine_share


class SloControl:
    """Samples in, the limit out: one per control-loop tick."""

    def __init__(
        self,
        *,
        objectives: Objectives | None = None,
        law: SloLimitConfig | None = None,
        binding: Callable[[], bool] = lambda: True,
        demand: Callable[[], int] = lambda: 0,
        starting: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``binding`` says whether the limit bound since it was last asked (the bulkhead's
        ``pressed``): only then may a limit grow; ``demand`` how many requests are in flight
        and waiting for a permit now, ``starting`` how many are starting (admitted, no first
        token yet) and waiting: slow start grows each limit towards its own."""
        self.objectives = objectives or Objectives()
        self.config = law or SloLimitConfig()
        self.binding = binding
        self.demand = demand
        self.starting = starting
        self.clock = clock  # the proxy's: the streams' timings are read on it
        self.limits = SloLaw(self.config)  # the law: started at the first plan
        self.last_step: Step | None = None  # what the last tick decided, and why
        self.verdict = PricingVerdict(
            mode="slo", steered=STEERED, without_preemption=WITHOUT_PREEMPTION
        )
        self.slots: int | None = None
        self.expected_ttft_s = 0.0  # engine TTFT p90, smoothed over ticks
        self.ends_per_s = 0.0  # relayed streams ended, over the last ENDS_WINDOW_S
        self._ends: deque[float] = deque()  # when each of them ended
        self._samples = _samples(), _samples()  # TTFT, TPOT over target
        self._ttfts = _samples()  # engine TTFTs in seconds, for the expected TTFT
        # Streams being relayed, with their objectives, and whether their TTFT was sampled.
        self._open: dict[StreamTiming, _Tracked] = {}
        self._typical: float | None = None  # tokens of a typical request, per the engine
        self._typical_prompt: float | None = None  # and of its prompt
        self._pool: tuple[int, int | None] | None = None  # the last plan's pool and block size
        self._asked: int | None = None  # the largest worst case a request asked for so far
        self._started_knowing = False  # the law started from a typical request, not the worst
        self._start_now: int | None = None  # where a fresh pod would start, at the last plan
        # The last cut: streams sent before it were admitted under the old limit, and what
        # they show is already answered, so only streams sent since count (one cut per round).
        self._epoch = -math.inf

    @property
    def law(self) -> SloLimit | None:
        """The limit on requests in flight (None before the first plan)."""
        return self.limits.in_flight

    @property
    def starts(self) -> SloLimit | None:
        """The limit on streams starting (None before the first plan)."""
        return self.limits.starts

    @property
    def drain_limit(self) -> int | None:
        """What the KV cache holds and frees, at the last tick (None: it does not tell)."""
        return self.limits.drain

    @property
    def unsupported(self) -> str | None:
        """Why the limit keeps to the worst case (None: the streams steer it)."""
        return self.verdict.unsupported

    @property
    def pricing(self) -> str:
        return self.verdict.pricing

    @property
    def pricing_reason(self) -> str:
        return self.verdict.reason

    def grows_fast(self, in_force: int) -> bool:
        """Whether a step now could raise the limit in force (``in_force``) by more than one:
        the limit that binds (the starts, or the requests in flight where they are fewer) is
        in slow start (no cut yet), the engine lets the limit pass the worst case, and no other
        cap holds it below the law's. Then a burst the limit binds on is worth a step at once
        rather than at the next tick (``CapacityController.hurry``). Not once the limit in
        flight was cut: hurried ticks would step it four times a second, past what the cache
        holds, while the starts, never cut, asked for them."""
        return not self.unsupported and self.limits.grows_fast(in_force)

    def in_flight_reach(self) -> int | None:
        """The most requests in flight slow start could bring: what the KV cache holds at the
        present mix (the drain ceiling at the last tick), or, where the cache was too cold to
        say (a burst on an idle pod, before the engine has started it), what the pool holds of
        the engine's typical prompt (``prompts_fit``); None where neither is known.

        Without the second, a burst's callers past what the cache holds waited for the tick
        after the engine had started the first ones before they were told (0.27-0.33 s, busy
        answer p50, on the GPU-shaped burst)."""
        if self.limits.drain is not None:
            return self.limits.drain
        if self._pool is None:
            return None
        pool_tokens, block_size = self._pool
        return prompts_fit(pool_tokens, self._typical_prompt, block_size)

    def cache_growth(self, engine: EngineReading | None) -> CacheGrowth | None:
        """The engine's KV cache as its running requests fill it, for the Retry-After forecast
        (here the drain ceiling decides who runs): the last plan's pool, the share used now, the
        engine's typical prompt and the pace a typical request decodes at (its generated
        tokens over the time it ran). None where the law keeps to the worst case, or the
        engine does not say one of them."""
        if engine is None or self._pool is None or self.unsupported:
            return None
        usage, prompt = engine.kv_usage_ratio, engine.typical_prompt_tokens
        generated, ran_s = engine.typical_generation_tokens, engine.typical_inference_s
        if usage is None or prompt is None or generated is None or not ran_s or ran_s <= 0:
            return None
        pool = self._pool[0]
        return CacheGrowth(
            pool_tokens=pool,
            used_tokens=usage * pool,
            prompt_tokens=prompt,
            tokens_per_s=generated / ran_s,
        )

    @property
    def tracked(self) -> int:
        """Streams being relayed now."""
        return len(self._open)

    def objectives_for(self, claims: Claims) -> Objectives:
        return objectives_of(claims, self.objectives)

    def max_wait_s(self, claims: Claims) -> float:
        """How long a request may wait for a permit: ``aim`` x its TTFT objective less the
        engine's expected TTFT (past that it would likely miss, so it is told at once), and no
        longer than its queue TTL where it claims one."""
        return max_wait_s(
            aim=self.config.aim,
            ttft_objective_s=self.objectives_for(claims).ttft_s,
            expected_ttft_s=self.expected_ttft_s,
            ttl_s=claims.ttl_s,
        )

    def asked(self, tokens: int) -> None:
        """A request asked for ``tokens`` at its worst (prompt and completion, every sequence):
        until the engine says what a typical request holds, the largest asked stands for it, so
        a fresh pod whose engine fits its longest context once does not start at one."""
        self._asked = max(self._asked or 0, tokens)

    def track(self, timing: StreamTiming, claims: Claims) -> None:
        """A stream is about to be relayed: its first token is sampled on the tick it comes."""
        self._open[timing] = _Tracked(self.objectives_for(claims))

    def ended(self, timing: StreamTiming, completed: bool) -> None:
        """A tracked stream ended: its TTFT if not sampled yet, and its TPOT if it completed.

        TPOT counts whenever the stream was sent: it is the engine's pace with the streams it
        runs now, which a queue left by an older limit does not inflate (TTFT is what that
        queue inflates, so only TTFT waits for streams sent since the last cut). Else a limit
        cut while long streams run hears nothing until streams sent after the cut complete:
        on the GPU-shaped emulated engine, 20 s at 15 where 23 fit. A stream sent before the
        last cut counts at most as on target (``aim``): it may let the limit grow, never cut
        it again for what the cut answered."""
        tracked = self._open.pop(timing, None)
        if tracked is None:
            return
        now = self.clock()
        self._ends.append(now)  # whatever the outcome, its KV cache is free again
        self._forget_ends(now)  # bounded even while no tick comes
        if not tracked.sampled:
            self._sample_ttft(timing, tracked)
        tpot = timing.tpot_s() if completed else None
        if tpot is not None:
            sample = tpot / tracked.objectives.tpot_s
            if timing.sent < self._epoch:
                # Sent before the last cut: its pace may say the engine keeps up (the limit
                # may grow), but not cut again for what that cut already answers (a burst's
                # prefills stall every decode for seconds: two cuts in a row took the
                # GPU-shaped engine from 51 to 12 in flight where 42 met the objectives).
                sample = min(sample, self.config.aim)
            self._samples[1].append(sample)

    def _sample_ttft(self, timing: StreamTiming, tracked: _Tracked) -> None:
        ttft = timing.ttft_s()
        if ttft is not None:
            tracked.sampled = True
            self._ttfts.append(ttft)
            if timing.sent >= self._epoch:
                self._samples[0].append(ttft / tracked.target(self.config.engine_share))

    def _harvest(self, now: float) -> None:
        """Each open stream's first token, on the tick it came; one still waiting past its
        target counts what it waited so far (a late start must not go unseen until it starts)."""
        share = self.config.engine_share
        for timing, tracked in self._open.items():
            if tracked.sampled:
                continue
            if timing.first is not None:
                self._sample_ttft(timing, tracked)
                continue
            target = tracked.target(share)
            if timing.sent >= self._epoch and (waited := now - timing.sent) > target:
                self._samples[0].append(waited / target)

    def observe(self, readings: Readings) -> tuple[ConfigWarning, ...]:
        """One tick: the engine's verdict, the expected TTFT and one step of the law."""
        engine = readings.engine
        if engine is not None:
            self._engine_seen(engine)
        warnings = self.verdict.warnings()
        if self.law is None:  # no plan yet: the samples wait for the first limit
            return warnings
        now = self.clock()
        self._harvest(now)
        (ttft, tpot), self._samples = self._samples, (_samples(), _samples())
        ttfts, self._ttfts = self._ttfts, _samples()
        if ttfts:
            p90 = quantile(list(ttfts), self.config.quantile)
            self.expected_ttft_s += TTFT_SMOOTHING * (p90 - self.expected_ttft_s)
        self._forget_ends(now)
        self.ends_per_s = len(self._ends) / ENDS_WINDOW_S
        step = self.limits.step(
            Tick(
                now=now,
                ttft=tuple(ttft),
                tpot=tuple(tpot),
                pressed=self.binding(),
                demand=self.demand(),
                starting=self.starting(),
                waiting=None if engine is None else engine.requests_waiting,
                kv_usage=None if engine is None else engine.kv_usage_ratio,
                running=None if engine is None else engine.requests_running,
                ends_per_s=self.ends_per_s,
                start=self._start_now,
            )
        )
        if step is not None:
            self._log(step, ttft_samples=len(ttft), tpot_samples=len(tpot))
        return warnings

    def _log(self, step: Step, *, ttft_samples: int, tpot_samples: int) -> None:
        """The step as the law decided it; a cut starts a new round of samples."""
        self.last_step = step
        if step.restarted:  # a limit back in slow start (a cut ends it: slo_backoff says so)
            log.info(
                "slo_restart", limit=step.in_flight, starts=step.starting, start=self._start_now
            )
        log.debug(
            "slo_step",
            limit=step.in_flight,
            starts=step.starting,
            gradient=step.gradient,
            starts_gradient=step.starts_gradient,
            ttft_samples=ttft_samples,
            tpot_samples=tpot_samples,
            pressed=step.pressed,
            expected_ttft_s=self.expected_ttft_s,
            drain_limit=step.drain,
            ends_per_s=self.ends_per_s,
            reason=step.reason,
        )
        if step.cut:
            self._epoch = self.clock()
            log.info(
                "slo_backoff",
                limit=step.in_flight,
                starts=step.starting,
                gradient=step.gradient,
                starts_gradient=step.starts_gradient,
                reason=step.reason,
            )

    def _forget_ends(self, now: float) -> None:
        """Drop the stream ends older than ``ENDS_WINDOW_S``."""
        ends = self._ends
        while ends and ends[0] < now - ENDS_WINDOW_S:
            ends.popleft()

    def _engine_seen(self, engine: EngineReading) -> None:
        self.slots = engine.slots
        if self.verdict.hear(engine):
            log.info("admission_pricing", pricing=self.pricing, reason=self.pricing_reason)
        prompt, generation = engine.typical_prompt_tokens, engine.typical_generation_tokens
        if prompt is not None:
            self._typical_prompt = prompt
        if prompt is not None and generation is not None:
            self._typical = prompt + generation

    def step(self, plan: Plan) -> Limits:
        """The law hears ``plan``: the first one starts it (and the engine's first, one made
        before the engine was seen). Returns the requests in flight it allows and, of them, how
        many may be starting at once (``SloLaw.limits``)."""
        worst_case_only = self.unsupported is not None
        typical = self._typical if self._typical is not None else self._asked
        start = start_limit(plan, typical, worst_case_only=worst_case_only)
        if self.limits.needs_start(engine_seen=self.verdict.engine_seen):
            self.limits.start(start, blind=not self.verdict.engine_seen)
            self._started_knowing = typical is not None
            log.info("slo_limit_start", limit=self.limits.held(), typical_tokens=typical)
        elif not self._started_knowing and typical is not None:
            # Started at the worst case, before any request said what one holds: lifted once.
            self._started_knowing = True
            self.limits.reach_start(start)
            log.info("slo_limit_start", limit=self.limits.held(), typical_tokens=typical)
        self._start_now = start
        self._pool = (plan.kv_pool_tokens, plan.cost.block_size)
        return self.limits.limits(permits=plan.permits, worst_case_only=worst_case_only)

    def document(self) -> dict[str, Any]:
        """The /capacity section: the limit, why it is priced so, and what steers it."""
        law = self.law
        return {
            "pricing": self.pricing,
            "pricing_reason": self.pricing_reason,
            "limit": law.limit if law is not None else None,
            "starts_limit": self.starts.limit if self.starts is not None else None,
            "last_gradient": None if law is None else law.last_gradient,
            "starts_gradient": None if self.starts is None else self.starts.last_gradient,
            "drain_limit": self.drain_limit,
            "reason": None if self.last_step is None else self.last_step.reason,
            "ends_per_s": round(self.ends_per_s, 3),
            "expected_ttft_s": round(self.expected_ttft_s, 4),
            "objectives": {"ttft_s": self.objectives.ttft_s, "tpot_s": self.objectives.tpot_s},
            "engine_share": self.config.engine_share,
            "streams_tracked": self.tracked,
        }

    def hold_limit(self) -> int | None:
        """The starts limit, which stands when the plan goes stale (the engine's /metrics slow
        or gone): it is steered by the streams the sidecar relays, not by the plan (the cap on
        requests in flight stays where the last plan left it). None where the engine was not
        seen to preempt (its worst case rules) or before the first plan."""
        return None if self.unsupported is not None else self.limits.held()
