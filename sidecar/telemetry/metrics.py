"""Prometheus metrics of the proxy: request outcomes and waits (counted as they happen) and the
bulkhead's state (read at scrape time). Every metric lives in the registry it is given."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.core.admission.decisions import LIMIT_UNITS, MODES, CompartmentSnapshot
from sidecar.core.outcomes import REQUEST_OUTCOMES
from sidecar.core.request.objectives import Objectives
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.limiter.events import BulkheadSnapshot
from sidecar.telemetry.gauges import gauge

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
# vLLM's own buckets (vllm:time_to_first_token_seconds, request_time_per_output_token_seconds),
# so that the sidecar's series and the engine's can be read side by side.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
SloResult = Literal["met", "missed", "unfinished"]
SLO_RESULTS: tuple[SloResult, ...] = ("met", "missed", "unfinished")
ReturnResult = Literal["admitted", "refused"]
RETURN_RESULTS: tuple[ReturnResult, ...] = ("admitted", "refused")


def slo_result(
    timing: StreamTiming, arrived: float, objectives: Objectives, *, completed: bool
) -> SloResult:
    """DistServe's test of one stream: completed, its first token within the TTFT objective of
    its arrival (what the client felt) and its mean time per output token within TPOT's."""
    if not completed:
        return "unfinished"
    tpot = timing.tpot_s()
    on_time = timing.first is not None and timing.first - arrived <= objectives.ttft_s
    return "met" if on_time and (tpot is None or tpot <= objectives.tpot_s) else "missed"


class RequestMetrics:
    """Counters and histograms fed by the proxy and by the bulkhead's decision events; every
    outcome is exported from the start, at 0."""

    def __init__(self, registry: CollectorRegistry, objectives: Objectives | None = None) -> None:
        self.objectives = objectives or Objectives()
        self.requests = Counter(
            "sidecar_requests",
            "Completion requests by how they ended (completed, rejected by reason, errors).",
            ["outcome"],
            registry=registry,
        )
        for outcome in REQUEST_OUTCOMES:
            self.requests.labels(outcome)
        self.duration = Histogram(
            "sidecar_request_duration_seconds",
            "Time from request arrival to the end of its answer.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "sidecar_queue_wait_seconds",
            "Time a request waited in the bulkhead queue before being granted or turned away.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "sidecar_time_to_first_token_seconds",
            "Time from a streaming request's arrival at the sidecar to its first token relayed "
            "(what the client feels: queue wait included).",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.engine_ttft = Histogram(
            "sidecar_engine_time_to_first_token_seconds",
            "Time from a streaming request sent to the engine to its first token relayed back.",
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "sidecar_time_per_output_token_seconds",
            "Mean time between token events of a completed stream, after its first.",
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.slo_streams = Counter(
            "sidecar_slo_streams",
            "Relayed streams by result against the default objectives (SIDECAR_SLO_TTFT_MS from "
            "arrival, SIDECAR_SLO_TPOT_MS): met, missed (completed late), unfinished (cancelled "
            "or failed). SLO attainment: met over these and the capacity refusals.",
            ["result"],
            registry=registry,
        )
        self.slo_tokens = Counter(
            "sidecar_slo_tokens",
            "Token events relayed, by their stream's result: met is SLO goodput, all of them the "
            "raw throughput.",
            ["result"],
            registry=registry,
        )
        for result in SLO_RESULTS:
            self.slo_streams.labels(result)
            self.slo_tokens.labels(result)
        self.returns = Counter(
            "sidecar_returns",
            "Callers back as a busy answer told them (the same request again, from its due "
            "time), by what they met: admitted, or refused again.",
            ["result"],
            registry=registry,
        )
        for back in RETURN_RESULTS:
            self.returns.labels(back)
        self.shadow = Counter(
            "sidecar_shadow_rejections",
            "Requests shadow mode let through that enforcement would have rejected.",
            ["reason"],
            registry=registry,
        )

    def finished(self, outcome: str, duration_s: float) -> None:
        self.requests.labels(outcome).inc()
        self.duration.observe(duration_s)

    def refused(self, outcome: str) -> None:
        """A request refused before it was one the proxy could time (at the port's door)."""
        self.requests.labels(outcome).inc()

    def returned(self, result: ReturnResult) -> None:
        """A caller back as told was admitted, or refused again."""
        self.returns.labels(result).inc()

    def waited(self, wait_s: float) -> None:
        self.queue_wait.observe(wait_s)

    def streamed(self, timing: StreamTiming, arrived: float, completed: bool) -> None:
        """A relayed stream's timing: its SLO result and tokens; its TTFTs once a token came, its
        TPOT if it completed."""
        result = slo_result(timing, arrived, self.objectives, completed=completed)
        self.slo_streams.labels(result).inc()
        self.slo_tokens.labels(result).inc(timing.tokens)
        if timing.first is None:
            return
        self.ttft.observe(max(0.0, timing.first - arrived))
        self.engine_ttft.observe(timing.ttft_s() or 0.0)
        tpot = timing.tpot_s() if completed else None
        if tpot is not None:
            self.tpot.observe(tpot)

    def shadow_rejected(self, reason: str) -> None:
        self.shadow.labels(reason).inc()


class BulkheadCollector(Collector):
    """Reads the bulkhead at scrape time, so the gauges are never out of date."""

    def __init__(
        self, snapshot: Callable[[], BulkheadSnapshot], plan_permits: Callable[[], int]
    ) -> None:
        self._snapshot = snapshot
        self._plan_permits = plan_permits

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        limit = snap.limit if MODES[snap.mode].limit_is_worst_case else self._plan_permits()
        yield gauge(
            "sidecar_permits_limit",
            "Worst-case requests the plan fits (the limit in count admission, the ceiling of "
            "slo's where the engine cannot preempt; see sidecar_admission_limit for the limit in "
            "force, in its unit).",
            limit,
        )
        yield gauge("sidecar_permits_in_use", "Requests in flight now.", snap.in_use)
        yield gauge(
            "sidecar_permit_utilisation",
            "Share of the admission limit in use, in the limit's unit (sidecar_admission_limit); "
            "not the scale-out signal, which is sidecar_utilisation.",
            limit_utilisation(snap),
        )
        yield from _admission_limit(snap)
        yield gauge("sidecar_queue_depth", "Requests waiting for a permit.", snap.queued)
        yield gauge(
            "sidecar_shadow_mode",
            "1 when decisions are computed but not enforced.",
            int(snap.shadow),
        )
        if MODES[snap.mode].reserves_kv_bytes:
            yield gauge(
                "sidecar_kv_reserved_bytes",
                "KV bytes reserved by requests in flight.",
                snap.in_use_cost,
            )
            yield gauge(
                "sidecar_kv_admissible_bytes",
                "KV bytes admission may reserve (alpha x pool).",
                snap.limit,
            )
        yield from _compartments(snap.compartments)


def limit_utilisation(snap: BulkheadSnapshot) -> float:
    """In-use cost over the limit, in the mode's unit (1 with any cost held against a 0 limit)."""
    if snap.limit:
        return snap.in_use_cost / snap.limit
    return 1.0 if snap.in_use_cost else 0.0


def _admission_limit(snap: BulkheadSnapshot) -> Iterator[Metric]:
    """The limit admission enforces and what in-flight requests hold of it, labelled by unit."""
    unit = LIMIT_UNITS[snap.mode]
    for name, help_, value in (
        (
            "sidecar_admission_limit",
            "The admission limit in force, in its unit (label).",
            snap.limit,
        ),
        (
            "sidecar_admission_in_use",
            "What requests in flight hold of the admission limit, in its unit (label).",
            snap.in_use_cost,
        ),
    ):
        family = GaugeMetricFamily(name, help_, labels=["unit"])
        family.add_metric([unit], value)
        yield family


def _compartments(compartments: tuple[CompartmentSnapshot, ...]) -> Iterator[Metric]:
    if not compartments:
        return
    families = {
        "guaranteed": GaugeMetricFamily(
            "sidecar_compartment_guaranteed",
            "Capacity reserved for the compartment.",
            labels=["compartment"],
        ),
        "ceiling": GaugeMetricFamily(
            "sidecar_compartment_ceiling",
            "Most capacity the compartment may use.",
            labels=["compartment"],
        ),
        "in_use_cost": GaugeMetricFamily(
            "sidecar_compartment_in_use",
            "Capacity the compartment uses now.",
            labels=["compartment"],
        ),
        "queued": GaugeMetricFamily(
            "sidecar_compartment_queue_depth",
            "Requests waiting in the compartment.",
            labels=["compartment"],
        ),
    }
    for part in compartments:
        for attribute, family in families.items():
            family.add_metric([part.name], getattr(part, attribute))
    yield from families.values()
