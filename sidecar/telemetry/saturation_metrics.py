"""The scale-out signal: each stream's latency against the objectives, the engine's KV use and
running requests as the capacity loop reads them, the requests refused lately and whether any
load is left, handed to the pure ``sidecar.core.laws.saturation``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.core.laws.saturation import (
    RUNNING_MIN_TOKENS,
    TERMS,
    LatencyShare,
    MeanWindow,
    OutcomeWindow,
    Saturation,
    SaturationConfig,
    SaturationEvidence,
    saturation,
    slot_use,
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


@dataclass(slots=True, kw_only=True)
class _Running:
    """A stream being relayed: when it arrived, the most requests that ran (``demand``: in
    flight or waiting, until its first token; ``in_use``: in flight, all along) while it was
    seen, and whether its TTFT is in the samples."""

    arrived: float
    demand: int
    in_use: int
    ttft_sampled: bool = False

    def saw(self, snap: BulkheadSnapshot) -> None:
        if not self.ttft_sampled:
            self.demand = max(self.demand, snap.in_use + snap.queued)
        self.in_use = max(self.in_use, snap.in_use)


class SaturationSignal:
    """``track`` hears each stream as it starts, ``streamed`` as it ends, ``observe`` each
    capacity tick; ``read`` gathers the rest (the bulkhead's queue, how long its oldest request
    has waited, the streams running now) and computes. A stream's first token is sampled on the
    tick or read after it came. ``max_num_seqs`` is the sequences the engine runs at once, where
    the operator said it (None: the engine's own slots, where it states them)."""

    def __init__(
        self,
        snapshot: Callable[[], BulkheadSnapshot],
        requests: Counter,
        clock: Callable[[], float],
        *,
        objectives: Objectives,
        oldest_wait_s: Callable[[], float] = lambda: 0.0,
        config: SaturationConfig | None = None,
        max_num_seqs: int | None = None,
    ) -> None:
        self._snapshot, self._requests, self._clock = snapshot, requests, clock
        self._oldest_wait_s = oldest_wait_s
        self.objectives = objectives
        self.config = c = config or SaturationConfig()
        self._ttft, self._tpot = LatencyShare(c), LatencyShare(c)
        self._kv = MeanWindow(c.window_s, c.max_samples)
        self._slots = MeanWindow(c.window_s, c.max_samples)
        self._max_num_seqs = max_num_seqs
        self._window = OutcomeWindow(c.window_s)
        # Streams being relayed (bounded by the admission limit; each leaves in ``streamed``).
        self._running: dict[StreamTiming, _Running] = {}

    def track(self, timing: StreamTiming, arrived: float) -> None:
        """A stream is about to be relayed (it arrived at ``arrived``)."""
        snap = self._snapshot()
        self._running[timing] = _Running(
            arrived=arrived, demand=snap.in_use + snap.queued, in_use=snap.in_use
        )

    def streamed(self, timing: StreamTiming, arrived: float, completed: bool) -> None:
        """A relayed stream ended: its TTFT from arrival once a token came, if not sampled
        yet, and its TPOT if it completed (as ``sidecar_slo_streams_total`` judges it)."""
        now, snap = self._clock(), self._snapshot()
        running = self._running.pop(timing, None) or _Running(arrived=arrived, demand=0, in_use=0)
        running.saw(snap)
        self._sample_ttft(now, timing, running)
        tpot = timing.tpot_s() if completed else None
        if tpot is not None:
            self._tpot.add(now, tpot / self.objectives.tpot_s, running.in_use)

    def _sample_ttft(self, now: float, timing: StreamTiming, running: _Running) -> None:
        if timing.first is None or running.ttft_sampled:
            return
        running.ttft_sampled = True
        ttft = max(0.0, timing.first - running.arrived)
        self._ttft.add(now, ttft / self.objectives.ttft_s, running.demand)

    def _harvest(self, now: float) -> None:
        """Each running stream's first token, once it came, and the load it runs under."""
        snap = self._snapshot()
        for timing, running in self._running.items():
            running.saw(snap)
            self._sample_ttft(now, timing, running)

    def observe(self, readings: Readings) -> None:
        """One capacity tick: the running streams' first tokens are sampled, the outcomes so
        far too (so the refusals' window keeps its length however rarely the signal is read),
        and the engine's KV use and its running requests over its sequence cap, where it said
        them and the cap is known, join the windows' means."""
        now = self._clock()
        self._harvest(now)
        self._window.recent(now, outcome_counts(self._requests))
        engine = readings.engine
        if engine is None:
            return
        if engine.kv_usage_ratio is not None:
            self._kv.add(now, engine.kv_usage_ratio / self.config.kv_full)
        slots = slot_use(
            engine.requests_running, max_num_seqs=self._max_num_seqs, engine_slots=engine.slots
        )
        if slots is not None:
            self._slots.add(now, slots)

    def evidence(self) -> SaturationEvidence:
        self._harvest(now := self._clock())
        snap = self._snapshot()
        offered, refused = self._window.recent(now, outcome_counts(self._requests))
        waited = max(self._oldest_wait_s(), self._oldest_start_s(now))
        return SaturationEvidence(
            ttft=self._ttft.share(now),
            waited=waited / self.objectives.ttft_s,
            tpot=self._tpot.share(now, self._paces(now)),
            kv=self._kv.mean(now),
            slots=self._slots.mean(now),
            loaded=snap.in_use > 0 or snap.queued > 0,
            recent_offered=offered,
            recent_refused=refused,
        )

    def _paces(self, now: float) -> list[float]:
        """The TPOT so far of the running streams past their first ``RUNNING_MIN_TOKENS``,
        over the objective."""
        paces = (t.tpot_so_far_s(now) for t in self._running if t.tokens >= RUNNING_MIN_TOKENS)
        return [pace / self.objectives.tpot_s for pace in paces if pace is not None]

    def _oldest_start_s(self, now: float) -> float:
        """How long the running stream longest without a first token has waited since it
        arrived (0 if none)."""
        return max(
            (now - r.arrived for t, r in self._running.items() if t.first is None), default=0.0
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
            "unloaded to the objective), kv (engine KV use), slots (engine running requests over "
            "its sequence cap), refusals (1 + the share refused).",
            labels=["term"],
        )
        for term in TERMS:
            terms.add_metric([term], getattr(now, term))
        yield terms
