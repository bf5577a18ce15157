"""Wiring from settings: the one place SIDECAR_* values become the lower layers' plain arguments.

The bulkhead, the capacity controller, its probes, its floor and its limit rule are all built here,
so nothing below the entry layer knows the settings exist.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from sidecar.core.capacity import Budget, KvCost, Plan, make_plan
from sidecar.core.compartments import parse_compartments
from sidecar.core.errors import ConfigError
from sidecar.core.model_spec import load_model_spec, weights_bytes_in
from sidecar.entry.settings import Settings
from sidecar.limiter.bulkhead import Bulkhead
from sidecar.live.control_loop import CapacityController, Floor
from sidecar.live.probes import GpuProbe
from sidecar.live.probes.engine import VllmMetricsProbe
from sidecar.live.probes.nvml import NvmlProbe, parse_gpu_selection
from sidecar.live.probes.static import Declared
from sidecar.live.sources import static_memory


def build_bulkhead(settings: Settings, *, limit: int, **seams: Any) -> Bulkhead:
    """A bulkhead configured by SIDECAR_* settings (ConfigError on a bad compartment spec)."""
    return Bulkhead(
        limit=limit,
        max_queue=settings.max_queue,
        max_wait_s=settings.max_wait_ms / 1000,
        mode=settings.admission,
        shadow=settings.shadow,
        max_in_flight=settings.max_concurrent_calls,
        compartments=parse_compartments(settings.compartments),
        **seams,
    )


def build_controller(
    settings: Settings,
    resize: Callable[[int], None],
    *,
    clock: Callable[[], float] = time.monotonic,
    nvml: GpuProbe | None = None,
    http_session: aiohttp.ClientSession | None = None,
) -> CapacityController:
    """The controller ``settings`` describe; ``nvml`` replaces the NVML probe (tests, demo)."""
    if not settings.model:
        raise ConfigError("SIDECAR_MODEL is required to size requests (a directory or a preset)")
    cost = KvCost(
        load_model_spec(settings.model),
        settings.kv_dtype,
        settings.tensor_parallel_size,
        settings.block_size,
    )
    budget = Budget(settings.max_prompt_tokens, settings.max_completion_tokens)
    declared = declared_from(settings, clock())
    limit_of = _limit_rule(settings)
    live = settings.capacity_source != "static"
    metrics_url = settings.engine_metrics_url or settings.upstream_url.rstrip("/") + "/metrics"
    return CapacityController(
        source=settings.capacity_source,
        cost=cost,
        budget=budget,
        alpha=settings.safety_factor,
        declared=declared,
        resize=resize,
        limit_of=limit_of,
        floor=_floor(settings, cost, budget, declared, limit_of),
        gpu_probe=(nvml or NvmlProbe(parse_gpu_selection(settings.gpus), clock=clock))
        if live
        else None,
        engine_probe=VllmMetricsProbe(metrics_url, session=http_session, clock=clock)
        if live
        else None,
        refresh_s=settings.refresh_ms / 1000,
        stale_after_s=settings.stale_after_ms / 1000,
        engine_pid=settings.engine_pid,
        tolerance=settings.disagreement_tolerance,
        clock=clock,
        probe_timeout_s=settings.probe_timeout_ms / 1000,
    )


def _limit_rule(settings: Settings) -> Callable[[Plan], int]:
    """Permits (capped by SIDECAR_MAX_CONCURRENT_CALLS) in count mode, bytes in token mode."""
    if settings.admission == "tokens":
        return lambda plan: plan.admissible_bytes
    cap = settings.max_concurrent_calls
    return lambda plan: plan.permits if cap is None else min(plan.permits, cap)


def _floor(
    settings: Settings,
    cost: KvCost,
    budget: Budget,
    declared: Declared,
    limit_of: Callable[[Plan], int],
) -> Floor:
    """SIDECAR_FLOOR_PERMITS, else the static plan where one is declared, else one permit."""
    per_request = cost.request_bytes(budget.total) if settings.admission == "tokens" else 1
    if settings.floor_permits is not None:
        return Floor(None, settings.floor_permits * per_request)
    if declared.plannable:
        plan = make_plan(cost, static_memory(declared), budget, settings.safety_factor)
        return Floor(plan, limit_of(plan))
    return Floor(None, per_request)


def declared_from(
    settings: Settings, now: float, weights_in: Callable[[Path], int] | None = None
) -> Declared:
    """Collect the declared numbers; measure the weights from the model directory where we can."""
    weights: int | None = None if settings.weights in (None, "auto") else int(settings.weights)
    measured = False
    model_dir = Path(settings.model) if settings.model else None
    if weights is None and model_dir is not None and model_dir.is_dir():
        weights = _measure(model_dir, weights_in)
        measured = weights is not None
    return Declared(
        vram_total_bytes=None if settings.vram_total is None else int(settings.vram_total),
        weights_bytes=weights,
        weights_measured=measured,
        overhead_bytes=int(settings.overhead),
        kv_pool_bytes=None if settings.kv_pool is None else int(settings.kv_pool),
        observed_at=now,
    )


def _measure(model_dir: Path, weights_in: Callable[[Path], int] | None) -> int | None:
    """The weight files' size; None (not fatal: the engine source needs no weights) if none."""
    try:
        size = (weights_in or weights_bytes_in)(model_dir)
    except ConfigError:
        return None
    return size if size > 0 else None
