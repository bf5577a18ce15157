"""The scale-out signal: the engine's readings as the capacity loop takes them, the bulkhead's
queue and the requests refused lately, handed to the pure ``sidecar.core.saturation``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.core.saturation import (
    EngineEvidence,
    EnginePeaks,
    OutcomeWindow,
    Saturation,
    SaturationConfig,
    SaturationEvidence,
    saturation,
)
from sidecar.limiter.events import BulkheadSnapshot
from sidecar.telemetry.gauges import gauge

if TYPE_CHECKING:
    from sidecar.live.sources import Readings

TERMS = ("kv", "engine_queue", "sidecar_queue", "refusals")


def outcome_counts(requests: Counter) -> dict[str, float]:
    """``sidecar_requests_total`` by outcome, as it stands (read through the public collect())."""
    return {
        sample.labels["outcome"]: sample.value
        for family in requests.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


class SaturationSignal:
    """``observe`` hears each tick's readings; ``read`` gathers the rest and computes."""

    def __init__(
        self,
        snapshot: Callable[[], BulkheadSnapshot],
        requests: Counter,
        clock: Callable[[], float],
        config: SaturationConfig | None = None,
    ) -> None:
        self._snapshot, self._requests, self._clock = snapshot, requests, clock
        self.config = config or SaturationConfig()
        self._engine = EnginePeaks(self.config.hold_s)
        self._window = OutcomeWindow(self.config.refusal_window_s)

    def observe(self, readings: Readings) -> None:
        """One capacity tick: the outcomes so far are sampled (so the refusals' window keeps
        its length however rarely the signal is read), and the engine's reading, if it
        answered, joins the held peaks."""
        now = self._clock()
        self._window.recent(now, outcome_counts(self._requests))
        engine = readings.engine
        if engine is None:
            return
        evidence = EngineEvidence(
            engine.kv_usage_ratio, engine.requests_running, engine.requests_waiting
        )
        self._engine.add(now, evidence)

    def evidence(self) -> SaturationEvidence:
        now, snap = self._clock(), self._snapshot()
        loaded = snap.in_use > 0 or snap.queued > 0
        kv, queue = self._engine.ratios(now, self.config, hold=loaded)
        offered, refused = self._window.recent(now, outcome_counts(self._requests))
        return SaturationEvidence(
            engine_kv=kv,
            engine_queue=queue,
            sidecar_in_flight=snap.in_use,
            sidecar_queued=snap.queued,
            recent_offered=offered,
            recent_refused=refused,
        )

    def read(self) -> Saturation:
        return saturation(self.evidence())


class SaturationCollector(Collector):
    """``sidecar_utilisation`` and the ratio of each term, read at scrape time."""

    def __init__(self, signal: SaturationSignal) -> None:
        self._signal = signal

    def collect(self) -> Iterator[Metric]:
        now = self._signal.read()
        yield gauge(
            "sidecar_utilisation",
            "Demand over capacity, the scale-out signal: near 0 idle, 1 or more once requests "
            "wait or are refused (the largest of sidecar_utilisation_term).",
            now.utilisation,
        )
        terms = GaugeMetricFamily(
            "sidecar_utilisation_term",
            "Each demand/capacity ratio the signal is the largest of: kv (engine KV use over "
            "its threshold), engine_queue, sidecar_queue, refusals.",
            labels=["term"],
        )
        for term in TERMS:
            terms.add_metric([term], getattr(now, term))
        yield terms
