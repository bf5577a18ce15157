"""Adaptive admission's moving parts, fed by the control loop: the over-commit ratio (AIMD on the
engine's evidence), the learned completion lengths, and the limit in tokens they give.

Over-commit is only for engines that preempt: one that exports no ``vllm:num_preemptions_total``
(the emulator's --oom mode, engines that crash on overflow) is priced at the worst case instead,
and an ``adaptive_unsupported`` warning says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import structlog

from sidecar.core.admission.decisions import AdmissionSnapshot
from sidecar.core.admission.estimator import CompletionEstimator, EstimatorConfig
from sidecar.core.admission.ledger import StreamUsage, in_blocks
from sidecar.core.exact import exact
from sidecar.core.laws.overcommit import AimdConfig, Overcommit, OvercommitEvidence
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import Plan
from sidecar.core.warnings import ConfigWarning
from sidecar.live.pricing import PricingVerdict
from sidecar.live.sources import Readings

log = structlog.get_logger("sidecar.live.adaptive")

STEERED = "the engine reports its KV usage, preemptions and queue: the limit follows them"


class AdaptiveCapacity:
    """Prices requests by their expected footprint and sets the limit in tokens, pool x ratio."""

    def __init__(
        self,
        *,
        estimator: EstimatorConfig | None = None,
        aimd: AimdConfig | None = None,
        binding: Callable[[], bool] = lambda: True,
    ) -> None:
        """``binding`` says whether the limit bound since it was last asked (requests waited or
        were refused for room): only then may the ratio grow."""
        self.estimator = CompletionEstimator(estimator)
        self.binding = binding
        self.overcommit = Overcommit(aimd)
        self.verdict = PricingVerdict(
            mode="adaptive", steered=STEERED, without_preemption="it may not preempt"
        )
        self.block_size = 1
        self.pool_tokens = 0
        self.slots: int | None = None  # the engine's fixed slots, where it has them (llama.cpp)

    @property
    def unsupported(self) -> str | None:
        """Why requests are priced at their worst case (None: over-commit steers)."""
        return self.verdict.unsupported

    @property
    def pricing(self) -> str:
        """closed-loop (steered by the engine's evidence) or worst-case (nothing to steer by)."""
        return self.verdict.pricing

    @property
    def pricing_reason(self) -> str:
        return self.verdict.reason

    @property
    def ratio(self) -> float:
        """The over-commit ratio in force (1 while falling back to worst-case pricing)."""
        return 1.0 if self.unsupported else self.overcommit.ratio

    def observe(self, readings: Readings) -> tuple[ConfigWarning, ...]:
        """One tick: step the AIMD on the engine's evidence; warn while over-commit is off."""
        engine = readings.engine
        if engine is None:
            # Not seen this tick: hold the ratio, keep the last verdict (unless never seen).
            return self.verdict.warnings()
        self.slots = engine.slots
        if self.verdict.hear(engine):
            log.info("admission_pricing", pricing=self.pricing, reason=self.pricing_reason)
        if self.unsupported is not None:
            return self.verdict.warnings()
        before = self.overcommit.ratio
        ratio = self.overcommit.observe(
            OvercommitEvidence(
                preemptions_total=engine.preemptions_total,
                kv_usage_ratio=engine.kv_usage_ratio,
                requests_waiting=engine.requests_waiting,
                # Until lengths are learned requests are priced at their worst case: a ratio
                # grown meanwhile would over-commit the moment the learned prices take over.
                binding=self.binding() and self.estimator.learned(),
            )
        )
        if ratio < before:
            log.info("adaptive_backoff", pressure=self.overcommit.last_pressure, ratio=ratio)
        return ()

    def step(self, plan: Plan) -> Limits:
        """The law hears ``plan`` (its block size and pool price the requests that follow): the
        limit is floor(pool tokens x alpha x ratio), never below one worst-case request of the
        budget; the engine's fixed slots, where it has them, cap the requests in flight."""
        self.block_size = plan.cost.block_size or 1
        self.pool_tokens = plan.kv_pool_tokens
        admissible = math.floor(plan.kv_pool_tokens * exact(plan.alpha) * exact(self.ratio))
        one = in_blocks(plan.request_max_tokens, self.block_size)
        return Limits(limit=max(admissible, min(one, plan.kv_pool_tokens)), in_flight=self.slots)

    def ceiling(self) -> int | None:
        """The largest worst case that can ever run: the whole pool (None before a plan)."""
        return self.pool_tokens or None

    def usage_for(
        self, compartment: str, prompt_tokens: int, max_tokens: int, sequences: int
    ) -> StreamUsage:
        """A new request's footprint: its growth as learned (the worst case if unsupported)."""
        learned = partial(self.estimator.growth, compartment, max_tokens)
        growth = None if self.unsupported else learned
        return StreamUsage(
            compartment=compartment,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            growth=growth,
            sequences=sequences,
            block_size=self.block_size,
        )

    def learn(self, usage: StreamUsage) -> None:
        """A request completed: its real completion length teaches its band."""
        self.estimator.observe(usage.compartment, usage.max_tokens, usage.completion_tokens())

    def document(self, snapshot: AdmissionSnapshot) -> dict[str, Any]:
        """The adaptive terms for /capacity: ratio, limit, ledger, learned lengths."""
        return {
            "pricing": self.pricing,
            "pricing_reason": self.pricing_reason,
            "overcommit_ratio": round(self.ratio, 4),
            "last_pressure": self.overcommit.last_pressure,
            "fallback_reason": self.unsupported,
            "min_samples": self.estimator.config.min_samples,
            "pool_tokens": self.pool_tokens,
            "limit_tokens": snapshot.limit,
            "ledger_tokens": snapshot.ledger_tokens,
            "ledger_reserved_tokens": snapshot.ledger_reserved_tokens,
            "expected_completion_tokens": [
                {"compartment": c, "band": band, "tokens": tokens, "samples": count}
                for (c, band), (tokens, count) in self.estimator.estimates().items()
            ],
        }
