"""The default admission's law (slo): the two SLO-steered limits, what each hears on a tick, where
they start, and the limits they give a plan. Pure: a ``Tick`` in, a ``Step`` out; the live loop
only gathers the samples and logs each step.

- ``in_flight`` counts requests in flight at the engine, steered by their time per output token
  and, while it grows fast, bounded by what the engine's KV cache holds at the present mix. Late
  first tokens judge it only where the engine does not say how full its cache is.
- ``starts`` counts streams between admission and their first token, steered by their time to
  first token while requests wait at the engine; held within ``in_flight``.
- the drain ceiling: what the cache holds at the present mix, and those the streams ending free
  room for within ``ENGINE_QUEUE_S``. It caps ``in_flight`` where it binds, never cuts the law,
  and where it binds the law does not grow.
- both start from what the engine can run (``start_limit``); a start from a plan made before the
  engine was seen is redone at the engine's first plan unless the law already stepped; a start
  made at the worst case, before any request said what a typical one holds, is lifted once to
  where a fresh pod starts with one (each limit still in slow start, the starts within the
  requests in flight).
- an engine that cannot preempt never gets more in flight than the plan's worst-case permits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sidecar.core.exact import exact
from sidecar.core.laws.slo_limit import (
    LimitEvidence,
    SloLimit,
    SloLimitConfig,
    drain_allowance,
    fits_in_cache,
)
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import Plan

# How long a request may wait at the engine for a full cache to free room: enough waiters there
# to refill the sequences that end within a few engine steps, the rest waiting at the sidecar,
# where they can still be refused with a Retry-After. At 0.8 s (the engine's share of a 2 s
# objective at the aim), vLLM on short prompts kept ~12 requests waiting and TTFT p99 at 2.7 s;
# at 0.25 s, SLO goodput went from 3,238 to 3,568 tok/s in the same run (docs/adaptive.md).
ENGINE_QUEUE_S = 0.25


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    """What one control-loop tick hears: ``ttft``, ``tpot``, the streams' samples over their
    targets since the last tick; ``pressed``: the limit bound meanwhile; ``demand``: requests in
    flight and waiting for a permit, ``starting``: streams starting and waiting; the engine's
    ``waiting``, ``kv_usage`` and ``running`` (None where it does not say); ``ends_per_s``:
    relayed streams ending, a second; ``start``: where a fresh pod starts at the last plan."""

    now: float
    ttft: tuple[float, ...]
    tpot: tuple[float, ...]
    pressed: bool
    demand: int
    starting: int
    waiting: float | None
    kv_usage: float | None
    running: float | None
    ends_per_s: float
    start: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """What one tick decided: the law's two limits (before the plan's caps), the drain ceiling,
    each limit's gradient, whether a limit was cut or went back into slow start, and why, in
    words a log line and /capacity print as they are."""

    in_flight: int
    starting: int
    drain: int | None
    gradient: float | None
    starts_gradient: float | None
    cut: bool
    restarted: bool
    pressed: bool
    reason: str


def start_limit(plan: Plan, typical_tokens: float | None, *, worst_case_only: bool) -> int:
    """What the engine can run: the pool x alpha over its typical request where it says one,
    else (or where it cannot preempt) the plan's worst-case permits; never below those."""
    if typical_tokens is None or typical_tokens <= 0 or worst_case_only:
        return max(1, plan.permits)
    fit = math.floor(plan.kv_pool_tokens * exact(plan.alpha) / exact(typical_tokens))
    return max(1, plan.permits, fit)


def capped(steered: Limits, *caps: int | None) -> Limits:
    """The limits the bulkhead enforces under slo: the law's requests in flight under every
    cap given (SIDECAR_MAX_CONCURRENT_CALLS, the engine's slots), and the starts within that."""
    own = steered.limit if steered.in_flight is None else steered.in_flight
    in_flight = min([own, *(cap for cap in caps if cap is not None)])
    return Limits(limit=min(in_flight, steered.limit), in_flight=in_flight)


def max_wait_s(
    *, aim: float, ttft_objective_s: float, expected_ttft_s: float, ttl_s: float | None
) -> float:
    """How long a request may wait for a permit: ``aim`` x its TTFT objective less the engine's
    expected TTFT (past that it would likely miss, so it is told at once), and no longer than its
    queue TTL where it claims one."""
    wait = max(0.0, aim * ttft_objective_s - expected_ttft_s)
    return wait if ttl_s is None else min(wait, ttl_s)


class SloLaw:
    """The two limits and the drain ceiling; None until the first plan starts them."""

    def __init__(self, config: SloLimitConfig | None = None) -> None:
        self.config = config or SloLimitConfig()
        self.in_flight: SloLimit | None = None
        self.starts: SloLimit | None = None
        self.drain: int | None = None  # what the KV cache holds and frees; None: unknown
        self._blind = False  # started from a plan made before the engine was seen

    def needs_start(self, *, engine_seen: bool) -> bool:
        """No limit yet, or a blind start the engine's first plan redoes (no step since)."""
        law = self.in_flight
        return law is None or (self._blind and engine_seen and law.last_gradient is None)

    def start(self, limit: int, *, blind: bool) -> None:
        """Both limits start (again) at ``limit``; ``blind``: the engine was not seen yet."""
        if self.in_flight is None or self.starts is None:
            self.in_flight = SloLimit(limit, self.config)
            self.starts = SloLimit(limit, self.config)
        else:
            self.in_flight.restart(limit)
            self.starts.restart(limit)
        self._blind = blind

    def reach_start(self, start: int) -> None:
        """Each limit still in slow start is at least ``start``, where a fresh pod starts at the
        present plan and typical request (a start the worst case made is lifted)."""
        law, starts = self.in_flight, self.starts
        if law is None or starts is None:
            return
        law.reach_start(start)
        starts.reach_start(start)
        starts.hold_within(law.limit)

    def step(self, tick: Tick) -> Step | None:
        """One step of both limits on ``tick``; None before the first plan started them."""
        law, starts = self.in_flight, self.starts
        if law is None or starts is None:
            return None
        before = (law.limit, starts.limit)
        slow = (law.slow_start, starts.slow_start)
        fits = fits_in_cache(tick.running, tick.kv_usage)
        self.drain = (
            None if fits is None else drain_allowance(fits, tick.ends_per_s, ENGINE_QUEUE_S)
        )
        draining = self.drain is not None and self.drain < law.limit
        queued = tick.waiting is None or tick.waiting > 0
        # In flight: the pace of tokens and the cache judge; where the drain ceiling binds and
        # not the law's own limit, the law does not grow. Late first tokens judge it only where
        # the engine does not say how full its cache is: where it does, a queue waiting for
        # memory is the ceiling's to answer (the law's cuts overshot it and grew back slowly: on
        # the GPU-shaped emulated engine, 327 tok/s of SLO goodput against the ceiling's 490,
        # median of three, in docs/lab/overload.md), and one waiting for compute or the engine's
        # sequence cap is the starts' (the start gate), not fewer running.
        in_flight = law.update(
            LimitEvidence(
                ttft=tick.ttft,
                tpot=tick.tpot,
                pressed=tick.pressed and tick.demand >= law.limit and not draining,
                ttft_judges=queued and tick.kv_usage is None,
                demand=tick.demand,
                fits=fits,
                now=tick.now,
                start=tick.start,
            )
        )
        # Starting: first tokens judge, while requests wait at the engine.
        starts.update(
            LimitEvidence(
                ttft=tick.ttft,
                pressed=tick.pressed,
                ttft_judges=queued,
                demand=tick.starting,
                now=tick.now,
                start=tick.start,
            )
        )
        starts.hold_within(in_flight)  # more starting than may run would bind nothing
        cut = in_flight < before[0] or starts.limit < before[1]
        restarted = (law.slow_start and not slow[0]) or (starts.slow_start and not slow[1])
        return Step(
            in_flight=in_flight,
            starting=starts.limit,
            drain=self.drain,
            gradient=law.last_gradient,
            starts_gradient=starts.last_gradient,
            cut=cut,
            restarted=restarted,
            pressed=tick.pressed,
            reason=self._reason(before, cut=cut, restarted=restarted, draining=draining),
        )

    def _reason(
        self, before: tuple[int, int], *, cut: bool, restarted: bool, draining: bool
    ) -> str:
        law, starts = self.in_flight, self.starts
        assert law is not None
        assert starts is not None
        if restarted:
            return "nobody pressed against the limit for a while: slow start again"
        if cut:
            return "cut: the streams' latencies past the aim (or TPOT past its objective)"
        if (law.limit, starts.limit) > before:
            return "grew: the streams meet their objectives and the limit binds"
        if draining:
            return "held: the engine's KV cache holds no more at the present mix"
        return "held: the limit does not bind, or the samples do not say more"

    def limits(self, *, permits: int, worst_case_only: bool) -> Limits:
        """The requests in flight the law allows (under the drain ceiling, and no more than the
        plan's worst-case ``permits`` where the engine cannot preempt) and, of them, how many
        may be starting at once (``Limits.limit``)."""
        law, starts = self.in_flight, self.starts
        assert law is not None  # started by the first plan
        assert starts is not None
        in_flight = law.limit if self.drain is None else min(law.limit, self.drain)
        if worst_case_only:
            in_flight = min(in_flight, max(1, permits))
        return Limits(limit=min(in_flight, starts.limit), in_flight=in_flight)

    def held(self) -> int | None:
        """The starts limit, which stands without a plan (None before the first)."""
        if self.in_flight is None or self.starts is None:
            return None
        return min(self.in_flight.limit, self.starts.limit)

    def grows_fast(self, in_force: int) -> bool:
        """Whether a step now could raise the limit in force by more than one: the limit that
        binds (the starts, or the requests in flight where they are fewer) is in slow start and
        ``in_force`` reached it. Where the drain ceiling holds the requests in flight below or at
        the law's own limit, and they bind, the law does not grow them (:meth:`step`)."""
        law, starts = self.in_flight, self.starts
        if law is None or starts is None:
            return False
        binding = starts if starts.limit < law.limit else law
        if binding is law and self.drain is not None and self.drain <= law.limit:
            return False
        return binding.slow_start and in_force >= binding.limit
