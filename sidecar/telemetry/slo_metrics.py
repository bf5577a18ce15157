"""What the SLO-steered admission shows, in /metrics and /capacity, read at scrape time."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sidecar.core.laws.slo_law import ENGINE_QUEUE_S
from sidecar.live.slo import ENDS_WINDOW_S, SloControl
from sidecar.telemetry.gauges import gauge


class SloCollector(Collector):
    """Reads the SLO control's state at scrape time."""

    def __init__(self, slo: SloControl) -> None:
        self._slo = slo

    def collect(self) -> Iterator[Metric]:
        slo = self._slo
        law = slo.law
        yield gauge(
            "sidecar_slo_limit",
            "The law's limit on requests in flight: what the streams' TPOT (and their TTFT, where "
            "requests wait at an engine that does not report its KV use) allow now. Not the cap in "
            "force, which is this under sidecar_slo_drain_limit, SIDECAR_MAX_CONCURRENT_CALLS, the "
            "engine's slots and, where it cannot preempt, the worst-case permits.",
            law.limit if law is not None else 0,
        )
        starts = slo.starts
        yield gauge(
            "sidecar_slo_starts_limit",
            "The law's limit on streams starting at once (admitted, no first token yet), as their "
            "TTFT allows now, never above sidecar_slo_limit; the bulkhead's limit "
            "(sidecar_admission_limit) is this under the cap on requests in flight.",
            starts.limit if starts is not None else 0,
        )
        yield gauge(
            "sidecar_slo_gradient",
            "The factor of the last step of the limit on requests in flight (above 1: it grew; "
            "below 1: it was cut, first tokens late past the aim or TPOT past its objective; NaN "
            "before the first step).",
            math.nan if law is None or law.last_gradient is None else law.last_gradient,
        )
        yield gauge(
            "sidecar_slo_drain_limit",
            "The requests in flight the engine's KV cache holds at the present mix plus those the "
            f"streams ending free room for within {ENGINE_QUEUE_S:g} s: a ceiling on "
            "sidecar_slo_limit (NaN where the engine's KV use does not tell).",
            math.nan if slo.drain_limit is None else slo.drain_limit,
        )
        yield gauge(
            "sidecar_slo_ends_per_second",
            f"Relayed streams ended per second over the last {ENDS_WINDOW_S:g} s: the pace at "
            "which a full KV cache frees room.",
            slo.ends_per_s,
        )
        yield gauge(
            "sidecar_slo_expected_ttft_seconds",
            "Engine TTFT p90, smoothed over ticks: a request's queue wait is capped at "
            f"{slo.config.aim:g} (the aim) x its TTFT objective less this.",
            slo.expected_ttft_s,
        )
        yield gauge(
            "sidecar_slo_fallback",
            "1 while the limit is held to the worst-case permits (engine without preemption).",
            int(slo.unsupported is not None),
        )
