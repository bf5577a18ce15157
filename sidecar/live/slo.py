"""The default admission's moving parts: the relayed streams' latencies against their objectives,
gathered between control-loop ticks, and the two SLO-steered limits they drive
(sidecar.core.laws.slo_limit).

- ``law`` counts requests in flight at the engine, steered by their time per output token and
  bounded, while it grows fast, by what the engine's KV cache holds at the present mix. It
  starts from what the engine can run: the pool over the typical request where the engine's own
  histograms say what that is (a warm engine, a restarted sidecar), else the pool over the worst
  case. An engine that exports no preemption counter (it fails on overflow instead) never gets
  more than its worst-case permits.
- ``drain_limit``: the requests in flight the engine's KV cache holds at the present mix, and
  those the streams ending make room for within ``ENGINE_QUEUE_S``. A ceiling read each tick
  from the engine's figures, never a cut of ``law``: as soon as the cache has room again the
  law's own limit stands.
- ``starts`` counts streams between admission and their first token, steered by their time to
  first token: how many prefills the engine is given at once. A stream's first token lets the
  next request start at once (the bulkhead's start gate), so the engine is fed as fast as it
  starts streams, not as fast as streams end.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from sidecar.core.admission.decisions import Limits
from sidecar.core.exact import exact
from sidecar.core.laws.slo_limit import (
    LimitEvidence,
    SloLimit,
    SloLimitConfig,
    drain_allowance,
    fits_in_cache,
    quantile,
)
from sidecar.core.plan.capacity import Plan
from sidecar.core.request.claims import Claims
from sidecar.core.request.objectives import Objectives, objectives_of
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.core.warnings import ConfigWarning, adaptive_unsupported
from sidecar.live.probes import EngineReading
from sidecar.live.sources import Readings

log = structlog.get_logger("sidecar.live.slo")

NO_PREEMPTION_SERIES = (
    "the engine exports no preemption counter (vllm:num_preemptions_total, "
    "sglang:num_retracted_requests_total): it may fail on overflow, so the limit never passes "
    "the worst-case permits"
)
NO_ENGINE = "no engine metrics to watch (capacity source without the engine)"
STEERED = "the limit follows the streams' TTFT and TPOT against their objectives"
# Weight of a new tick's p90 engine TTFT in the expected TTFT that bounds the queue wait.
TTFT_SMOOTHING = 0.5
# Streams that ended in the last this many seconds give the pace at which a full cache frees.
ENDS_WINDOW_S = 5.0
# How long a request may wait at the engine for a full cache to free room: enough waiters there
# to refill the sequences that end within a few engine steps, the rest waiting at the sidecar,
# where they can still be refused with a Retry-After. At 0.8 s (the engine's share of a 2 s
# objective at the aim), vLLM on short prompts kept ~12 requests waiting and TTFT p99 at 2.7 s;
# at 0.25 s, SLO goodput went from 3,238 to 3,568 tok/s in the same run (docs/adaptive.md).
ENGINE_QUEUE_S = 0.25


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
        self.law: SloLimit | None = None  # made at the first plan, from what the engine can run
        self.starts: SloLimit | None = None  # made with it
        self.unsupported: str | None = NO_ENGINE
        self.slots: int | None = None
        self.expected_ttft_s = 0.0  # engine TTFT p90, smoothed over ticks
        self.drain_limit: int | None = None  # what the KV cache holds and frees; None: unknown
        self.ends_per_s = 0.0  # relayed streams ended, over the last ENDS_WINDOW_S
        self._ends: deque[float] = deque()  # when each of them ended
        self._samples: tuple[list[float], list[float]] = ([], [])  # TTFT, TPOT over target
        self._ttfts: list[float] = []
        # Streams being relayed, with their objectives, and whether their TTFT was sampled.
        self._open: dict[StreamTiming, _Tracked] = {}
        self._typical: float | None = None  # tokens of a typical request, per the engine
        self._started_blind = False  # the law started from a plan made before the engine was seen
        self._start_now: int | None = None  # where a fresh pod would start, at the last plan
        # The last cut: streams sent before it were admitted under the old limit, and what
        # they show is already answered, so only streams sent since count (one cut per round).
        self._epoch = -math.inf

    @property
    def pricing(self) -> str:
        return "worst-case" if self.unsupported else "closed-loop"

    @property
    def pricing_reason(self) -> str:
        return self.unsupported or STEERED

    def grows_fast(self, in_force: int) -> bool:
        """Whether a step now could raise the limit in force (``in_force``) by more than one:
        the limit that binds (the starts, or the requests in flight where they are fewer) is
        in slow start (no cut yet), the engine lets the limit pass the worst case, and no other
        cap holds it below the law's. Then a burst the limit binds on is worth a step at once
        rather than at the next tick (``CapacityController.hurry``). Not once the limit in
        flight was cut: hurried ticks would step it four times a second, past what the cache
        holds, while the starts, never cut, asked for them."""
        law, starts = self.law, self.starts
        if law is None or starts is None or self.unsupported:
            return False
        binding = starts if starts.limit < law.limit else law
        return binding.slow_start and in_force >= binding.limit

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
        budget = self.config.aim * self.objectives_for(claims).ttft_s
        wait = max(0.0, budget - self.expected_ttft_s)
        return wait if claims.ttl_s is None else min(wait, claims.ttl_s)

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
        if self.law is None:  # no plan yet: the samples wait for the first limit
            return (adaptive_unsupported(self.unsupported, "slo"),) if self.unsupported else ()
        now = self.clock()
        self._harvest(now)
        (ttft, tpot), self._samples = self._samples, ([], [])
        ttfts, self._ttfts = self._ttfts, []
        if ttfts:
            p90 = quantile(ttfts, self.config.quantile)
            self.expected_ttft_s += TTFT_SMOOTHING * (p90 - self.expected_ttft_s)
        law, starts = self.law, self.starts
        assert starts is not None  # made with the law
        before = (law.limit, starts.limit)
        pressed = self.binding()
        waiting = engine.requests_waiting if engine is not None else None
        queued = waiting is None or waiting > 0
        kv = engine.kv_usage_ratio if engine is not None else None
        fits = fits_in_cache(engine.requests_running, kv) if engine is not None else None
        demand = self.demand()
        self._forget_ends(now)
        self.ends_per_s = len(self._ends) / ENDS_WINDOW_S
        # The drain ceiling: what the cache holds at the present mix (``fits``), and those the
        # streams ending free room for within ENGINE_QUEUE_S; none where the cache cannot tell.
        self.drain_limit = (
            None if fits is None else drain_allowance(fits, self.ends_per_s, ENGINE_QUEUE_S)
        )
        draining = self.drain_limit is not None and self.drain_limit < law.limit
        # In flight: the pace of tokens and the cache judge; the drain ceiling holds it to what
        # the cache holds and frees, and the law, where that ceiling binds and not its own
        # limit, does not grow. Late first tokens judge it only where the engine does not say
        # how full its cache is: where it does, a queue waiting for memory is the ceiling's to
        # answer (the law's cuts overshot it and grew back slowly: on the GPU-shaped emulated
        # engine, 327 tok/s of SLO goodput against the ceiling's 490, median of three, in
        # docs/lab/overload.md), and one waiting for compute or the engine's sequence cap is the
        # starts' (the start gate), not fewer running. It binds only where there is demand.
        slow_starts = (law.slow_start, starts.slow_start)
        in_flight = LimitEvidence(
            ttft=tuple(ttft),
            tpot=tuple(tpot),
            pressed=pressed and demand >= law.limit and not draining,
            ttft_judges=queued and kv is None,
            demand=demand,
            fits=fits,
            now=now,
            start=self._start_now,
        )
        # Starting: first tokens judge, while requests wait at the engine.
        starting = LimitEvidence(
            ttft=tuple(ttft),
            pressed=pressed,
            ttft_judges=queued,
            demand=self.starting(),
            now=now,
            start=self._start_now,
        )
        in_flight_limit = law.update(in_flight)
        starts.update(starting)
        starts.hold_within(in_flight_limit)  # more starting than may run would bind nothing
        after = (in_flight_limit, starts.limit)
        back = (law.slow_start and not slow_starts[0], starts.slow_start and not slow_starts[1])
        if any(back):  # a limit back in slow start (a cut ends it: slo_backoff says so)
            log.info("slo_restart", limit=after[0], starts=after[1], start=self._start_now)
        log.debug(
            "slo_step",
            limit=after[0],
            starts=after[1],
            gradient=law.last_gradient,
            starts_gradient=starts.last_gradient,
            ttft_samples=len(ttft),
            tpot_samples=len(tpot),
            pressed=pressed,
            expected_ttft_s=self.expected_ttft_s,
            drain_limit=self.drain_limit,
            ends_per_s=self.ends_per_s,
        )
        if after[0] < before[0] or after[1] < before[1]:
            self._epoch = self.clock()
            log.info(
                "slo_backoff",
                limit=after[0],
                starts=after[1],
                gradient=law.last_gradient,
                starts_gradient=starts.last_gradient,
            )
        return (adaptive_unsupported(self.unsupported, "slo"),) if self.unsupported else ()

    def _forget_ends(self, now: float) -> None:
        """Drop the stream ends older than ``ENDS_WINDOW_S``."""
        ends = self._ends
        while ends and ends[0] < now - ENDS_WINDOW_S:
            ends.popleft()

    def _engine_seen(self, engine: EngineReading) -> None:
        self.slots = engine.slots
        reason = NO_PREEMPTION_SERIES if engine.preemptions_total is None else None
        if reason != self.unsupported:
            self.unsupported = reason
            log.info("admission_pricing", pricing=self.pricing, reason=self.pricing_reason)
        prompt, generation = engine.typical_prompt_tokens, engine.typical_generation_tokens
        if prompt is not None and generation is not None:
            self._typical = prompt + generation

    def step(self, plan: Plan) -> Limits:
        """The law hears ``plan``: the first one starts it (and the engine's first, one made
        before the engine was seen). Returns the requests in flight it allows (``in_flight``:
        the law's limit under the drain ceiling, and never above the worst-case permits where
        the engine cannot preempt) and, of them, how many may be starting at once (``limit``)."""
        law = self.law
        if law is None or (
            self._started_blind and self.unsupported != NO_ENGINE and law.last_gradient is None
        ):
            law = self._start_law(plan)
        assert self.starts is not None  # made with the law
        self._start_now = self._start(plan)
        in_flight = law.limit if self.drain_limit is None else min(law.limit, self.drain_limit)
        if self.unsupported:
            in_flight = min(in_flight, max(1, plan.permits))
        return Limits(limit=min(in_flight, self.starts.limit), in_flight=in_flight)

    def _start_law(self, plan: Plan) -> SloLimit:
        """The law, from what the engine can run. A plan made before the engine was seen (the
        floor's, from declared figures) starts it only until the engine's first plan: then it
        starts again, with the engine's pool and typical request, unless it already stepped."""
        start = self._start(plan)
        if self.law is None or self.starts is None:
            self.law = SloLimit(start, self.config)
            self.starts = SloLimit(start, self.config)
        else:
            self.law.restart(start)
            self.starts.restart(start)
        self._started_blind = self.unsupported == NO_ENGINE
        log.info("slo_limit_start", limit=self.law.limit, typical_tokens=self._typical)
        return self.law

    def hold_limit(self) -> int | None:
        """The starts limit, which stands when the plan goes stale (the engine's /metrics slow
        or gone): it is steered by the streams the sidecar relays, not by the plan (the cap on
        requests in flight stays where the last plan left it). None where the engine was not
        seen to preempt (its worst case rules) or before the first plan."""
        if self.law is None or self.starts is None or self.unsupported is not None:
            return None
        return min(self.law.limit, self.starts.limit)

    def _start(self, plan: Plan) -> int:
        """What the engine can run: the pool over its typical request where it says one, else
        over the worst case (the plan's permits)."""
        if self._typical is None or self._typical <= 0 or self.unsupported:
            return max(1, plan.permits)
        fit = math.floor(plan.kv_pool_tokens * exact(plan.alpha) / exact(self._typical))
        return max(1, plan.permits, fit)
