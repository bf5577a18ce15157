"""What adaptive admission shows: the over-commit ratio, the learned lengths and the live ledger
next to the engine's own usage, in /metrics and /capacity, read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.limiter.events import BulkheadSnapshot
from sidecar.live.adaptive import AdaptiveCapacity
from sidecar.telemetry.gauges import gauge


class AdaptiveCollector(Collector):
    """Reads the adaptive state and the bulkhead's ledger at scrape time."""

    def __init__(
        self, adaptive: AdaptiveCapacity, snapshot: Callable[[], BulkheadSnapshot]
    ) -> None:
        self._adaptive, self._snapshot = adaptive, snapshot

    def collect(self) -> Iterator[Metric]:
        adaptive, snap = self._adaptive, self._snapshot()
        yield gauge(
            "sidecar_adaptive_overcommit_ratio",
            "Admissible expected tokens / (alpha x KV pool tokens); AIMD on the engine's evidence.",
            adaptive.ratio,
        )
        yield gauge(
            "sidecar_adaptive_fallback",
            "1 while adaptive admission prices every request at its worst case (engine without "
            "preemption).",
            int(adaptive.unsupported is not None),
        )
        yield gauge(
            "sidecar_adaptive_limit_tokens", "Expected tokens admission may hold now.", snap.limit
        )
        yield gauge(
            "sidecar_ledger_tokens",
            "Tokens running streams hold now, as the sidecar relayed them (prompt + completion).",
            snap.ledger_tokens,
        )
        yield gauge(
            "sidecar_ledger_reserved_tokens",
            "Tokens running streams are charged: what they hold plus their expected growth.",
            snap.ledger_reserved_tokens,
        )
        yield from _expected(adaptive)


def _expected(adaptive: AdaptiveCapacity) -> Iterator[Metric]:
    labels = ["compartment", "band"]
    expected = GaugeMetricFamily(
        "sidecar_adaptive_expected_completion_tokens",
        "Completion tokens a request is priced at, per compartment and max_tokens band "
        "(the band's max while too few samples).",
        labels=labels,
    )
    samples = GaugeMetricFamily(
        "sidecar_adaptive_completion_samples",
        "Completed requests the estimate of a band rests on (recent window).",
        labels=labels,
    )
    for (compartment, band), (tokens, count) in adaptive.estimator.estimates().items():
        expected.add_metric([compartment, str(band)], tokens)
        samples.add_metric([compartment, str(band)], count)
    yield expected
    yield samples
