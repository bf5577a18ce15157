"""What the capacity controller shows: /capacity JSON and Prometheus gauges, read at scrape time.

Nothing is registered globally; the collector goes on the registry it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from sidecar.core.warnings import WARNING_CODES
from sidecar.telemetry.gauges import gauge

if TYPE_CHECKING:
    from sidecar.live.control_loop import CapacityController, CapacityState


class _CapacityCollector(Collector):
    """Reads the controller's state at scrape time."""

    def __init__(self, controller: CapacityController, clock: Callable[[], float]) -> None:
        self._controller, self._clock = controller, clock

    def collect(self) -> Iterator[Metric]:
        state = self._controller.state
        yield gauge(
            "sidecar_capacity_stale", "1 while the plan is stale or on the floor", int(state.stale)
        )
        yield gauge(
            "sidecar_capacity_on_floor",
            "1 while the conservative floor is in force",
            int(state.on_floor),
        )
        yield gauge("sidecar_capacity_limit", "the limit handed to the bulkhead", state.limit)
        age = state.age_s(self._clock())
        yield gauge(
            "sidecar_plan_age_seconds",
            "seconds since the last good plan",
            float("nan") if age is None else age,
        )
        if state.plan is not None:
            yield gauge("sidecar_kv_pool_bytes", "KV pool of the group", state.plan.kv_pool_bytes)
            yield gauge(
                "sidecar_kv_bytes_per_token",
                "KV bytes per token, whole model",
                state.plan.kv_bytes_per_token,
            )
            yield gauge(
                "sidecar_request_max_bytes",
                "one request's worst case, whole model",
                state.plan.request_max_bytes,
            )
        yield from _reading_metrics(state)
        yield _warnings(state)


def _warnings(state: CapacityState) -> Metric:
    """1 for each standing warning's code, 0 for every other known code (alerts use == 1)."""
    standing = {w.code for w in state.warnings}
    family = GaugeMetricFamily(
        "sidecar_config_warning",
        "1 while a configuration warning stands (see /capacity warnings for the message).",
        labels=["code"],
    )
    for code in WARNING_CODES:
        family.add_metric([code], int(code in standing))
    return family


def _reading_metrics(state: CapacityState) -> Iterator[Metric]:
    readings = state.readings
    gpus = readings.gpus.gpus if readings and readings.gpus else ()
    for kind in ("total", "used", "free"):
        family = GaugeMetricFamily(
            f"sidecar_gpu_memory_{kind}_bytes",
            f"GPU memory {kind}, as NVML reports it",
            labels=["gpu"],
        )
        for gpu in gpus:
            family.add_metric([gpu.uuid], getattr(gpu, f"{kind}_bytes"))
        yield family
    engine = readings.engine if readings else None
    if engine is not None and engine.kv_usage_ratio is not None:
        yield gauge(
            "sidecar_engine_kv_usage_ratio",
            "the engine's KV cache usage, 0..1",
            engine.kv_usage_ratio,
        )
    ratio = GaugeMetricFamily(
        "sidecar_capacity_disagreement_ratio",
        "|engine pool - NVML's view| / engine pool",
        labels=["gpu"],
    )
    for check in state.disagreements:
        ratio.add_metric([check.gpu], check.ratio)
    yield ratio
    room = GaugeMetricFamily(
        "sidecar_engine_headroom_bytes",
        "what the engine's memory fraction leaves free on a GPU, less what other processes hold "
        "(below 0: they reach into the engine's share)",
        labels=["gpu"],
    )
    for each in state.headroom:
        room.add_metric([each.gpu], each.left_free_bytes - each.others_bytes)
    yield room


def register_capacity_metrics(
    registry: CollectorRegistry, controller: CapacityController, clock: Callable[[], float]
) -> None:
    """Export the controller's live state on ``registry``, read at scrape time."""
    registry.register(_CapacityCollector(controller, clock))


def capacity_json(state: CapacityState, requested: str, now: float) -> dict[str, Any]:
    """/capacity: the plan in force, every term with its source and age, the live readings."""
    plan = state.plan.to_dict() if state.plan else None
    if plan is not None:
        for term in plan["terms"]:
            seen = term.pop("observed_at")  # monotonic seconds: only the age means anything
            term["age_s"] = None if seen is None else round(max(0.0, now - seen), 3)
    readings = state.readings
    return {
        "source": state.source,
        "requested_source": requested,
        "mode": state.mode,
        "stale": state.stale,
        "on_floor": state.on_floor,
        "limit": state.limit,
        "plan_age_s": state.age_s(now),
        "error": state.error,
        "warnings": [w.to_dict() for w in state.warnings],
        "served_model": readings.engine.served_model if readings and readings.engine else None,
        "plan": plan,
        "gpus": [asdict(g) for g in readings.gpus.gpus] if readings and readings.gpus else [],
        "engine": asdict(readings.engine) if readings and readings.engine else None,
        "disagreements": [asdict(d) for d in state.disagreements],
        "headroom": [asdict(h) | {"taken_bytes": h.taken_bytes} for h in state.headroom],
    }
