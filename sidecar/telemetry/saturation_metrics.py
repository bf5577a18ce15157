"""The scale-out signal: each stream's latency against the objectives, the engine's KV use as
the capacity loop reads it, the requests refused lately and whether any load is left, handed to
the pure ``sidecar.core.laws.saturation``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.core.laws.saturation import (
    TERMS,
    LatencyShare,
    MeanWindow,
    OutcomeWindow,
    Saturation,
    SaturationConfig,
    SaturationEvidence,
    saturation,
)
from sidecar.core.request.objectives import Objectives
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.limiter.events import BulkheadSnapshot
from sidecar.telemetry.gauges import gauge

if TYPE_CHECKING:
    from sidecar.live.sources import Readings


def outcome_counts(requests: Counter) -> dict[str, float]:
    """``sidecar_requests_total`` by outcome, as it stands (read through the public collect())."""
    return {
        sample.labels["outcome"]: sample.value
        for family in requests.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


class SaturationSignal:
    """``streamed`` hears each stream as it ends, ``observe`` each capacity tick; ``read``
    gathers the rest (the bulkhead's queue, how long its oldest request has waited) and
    computes."""

    def __init__(
        self,
        snapshot: Callable[[], BulkheadSnapshot],
        requests: Counter,
        clock: Callable[[], float],
        *,
        objectives: Objectives,
        oldest_wait_s: Callable[[], float] = lambda: 0.0,
        config: SaturationConfig | None = None,
    ) -> None:
        self._snapshot, self._requests, self._clock = snapshot, requests, clock
        self._oldest_wait_s = oldest_wait_s
        self.objectives = objectives
        self.config = c = config or SaturationConfig()
        self._ttft, self._tpot = LatencyShare(c), LatencyShare(c)
        self._kv = MeanWindow(c.window_s, c.max_samples)
        self._window = OutcomeWindow(c.window_s)

    def streamed(self, timing: StreamTiming, arrived: float, completed: bool) -> None:
        """A relayed stream ended: its TTFT from arrival once a token came, its TPOT if it
        completed (as ``sidecar_slo_streams_total`` judges it)."""
        now = self._clock()
        if timing.first is not None:
            self._ttft.add(now, max(0.0, timing.first - arrived) / self.objectives.ttft_s)
        tpot = timing.tpot_s() if completed else None
        if tpot is not None:
            self._tpot.add(now, tpot / self.objectives.tpot_s)

    def observe(self, readings: Readings) -> None:
        """One capacity tick: the outcomes so far are sampled (so the refusals' window keeps
        its length however rarely the signal is read), and the engine's KV use, if it said it,
        joins the window's mean."""
        now = self._clock()
        self._window.recent(now, outcome_counts(self._requests))
        engine = readings.engine
        if engine is not None and engine.kv_usage_ratio is not None:
            self._kv.add(now, engine.kv_usage_ratio / self.config.kv_full)

    def evidence(self) -> SaturationEvidence:
        now, snap = self._clock(), self._snapshot()
        offered, refused = self._window.recent(now, outcome_counts(self._requests))
        return SaturationEvidence(
            ttft=self._ttft.share(now),
            waited=self._oldest_wait_s() / self.objectives.ttft_s,
            tpot=self._tpot.share(now),
            kv=self._kv.mean(now),
            loaded=snap.in_use > 0 or snap.queued > 0,
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
            "The share of the pod's capacity in use, the scale-out signal: 0 idle, 1 at what it "
            "serves within the objectives, past 1 once they are missed or requests are refused "
            "(the largest of sidecar_utilisation_term).",
            now.utilisation,
        )
        terms = GaugeMetricFamily(
            "sidecar_utilisation_term",
            "Each term the signal is the largest of: ttft and tpot (P95 latency's climb from "
            "unloaded to the objective), kv (engine KV use), refusals (1 + the share refused).",
            labels=["term"],
        )
        for term in TERMS:
            terms.add_metric([term], getattr(now, term))
        yield terms
