"""Wiring from settings: the one place SIDECAR_* values become the lower layers' plain arguments.

The bulkhead, the capacity controller, its probes, its floor and its limit rule are all built here,
so nothing below the entry layer knows the settings exist.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from sidecar.core.admission.compartments import parse_compartments
from sidecar.core.admission.decisions import Mode
from sidecar.core.admission.estimator import EstimatorConfig
from sidecar.core.admission.modes import AdaptiveMode, AdmissionMode, CountMode, SloMode, TokenMode
from sidecar.core.errors import ConfigError
from sidecar.core.laws.overcommit import AimdConfig
from sidecar.core.laws.saturation import SaturationConfig
from sidecar.core.limits import Limits
from sidecar.core.model.model_spec import load_model_spec, weights_bytes_in
from sidecar.core.plan.capacity import Budget, KvCost, engine_cost, make_plan
from sidecar.core.plan.token_budget import resolve_budget
from sidecar.core.request.objectives import Objectives
from sidecar.core.warnings import ConfigWarning
from sidecar.edge.engine.pool import EnginePool
from sidecar.edge.overload import OverloadManager, OverloadThresholds, Port
from sidecar.edge.proxy.prompt_count import EnginePromptCounter
from sidecar.entry.settings import Settings
from sidecar.limiter.bulkhead import Bulkhead
from sidecar.live.adaptive import AdaptiveCapacity
from sidecar.live.control_loop import (
    Cadence,
    CapacityController,
    Floor,
    Planning,
    Sinks,
    Sources,
)
from sidecar.live.declared_memory import static_memory
from sidecar.live.probes import GpuProbe
from sidecar.live.probes.engine_probe import ENGINES, EngineMetricsProbe
from sidecar.live.probes.nvml import NvmlProbe, parse_gpu_selection
from sidecar.live.probes.static import Declared
from sidecar.live.slo import SloControl
from sidecar.live.sources import Readings


def admission_mode(settings: Settings) -> Mode:
    """The mode SIDECAR_ADMISSION asks for; ``auto`` is slo, which keeps to the worst-case
    permits by itself where the engine cannot preempt (static and NVML-only sources, engines
    that fail on overflow)."""
    return "slo" if settings.admission == "auto" else settings.admission


def build_slo(
    settings: Settings,
    binding: Callable[[], bool] = lambda: True,
    clock: Callable[[], float] = time.monotonic,
    demand: Callable[[], int] = lambda: 0,
    starting: Callable[[], int] = lambda: 0,
) -> SloControl | None:
    """The SLO-steered limits' state (None unless the mode is slo); ``binding`` tells it
    whether its limit bound lately (the bulkhead's ``pressed``), ``demand`` how many requests
    are in flight and queued, ``starting`` how many are starting and queued."""
    if admission_mode(settings) != "slo":
        return None
    return SloControl(
        objectives=objectives_of_settings(settings),
        binding=binding,
        demand=demand,
        starting=starting,
        clock=clock,
    )


def signal_config_of_settings(settings: Settings) -> SaturationConfig:
    """The scale-out signal's windows and scale: the SIDECAR_UTILISATION_* settings."""
    s = settings
    return SaturationConfig(
        window_s=s.utilisation_window_s,
        quantile=s.utilisation_quantile,
        kv_full=s.utilisation_kv_full,
        floor_window_s=s.utilisation_floor_window_s,
        floor_cap=s.utilisation_floor_cap,
    )


def objectives_of_settings(settings: Settings) -> Objectives:
    """The default objectives: SIDECAR_SLO_TTFT_MS and SIDECAR_SLO_TPOT_MS, in seconds."""
    return Objectives(settings.slo_ttft_ms / 1000, settings.slo_tpot_ms / 1000)


def build_bulkhead(
    settings: Settings, mode: AdmissionMode, *, limit: int, **seams: Any
) -> Bulkhead:
    """A bulkhead configured by SIDECAR_* settings, enforcing ``mode`` (ConfigError on a bad
    compartment spec)."""
    return Bulkhead(
        limit=limit,
        max_queue=settings.max_queue,
        max_wait_s=settings.max_wait_ms / 1000,
        return_wait_s=max(settings.return_wait_ms, settings.max_wait_ms) / 1000,
        mode=mode,
        shadow=settings.shadow,
        max_in_flight=settings.max_concurrent_calls,
        compartments=parse_compartments(settings.compartments),
        **seams,
    )


def build_adaptive(
    settings: Settings, binding: Callable[[], bool] = lambda: True
) -> AdaptiveCapacity | None:
    """The adaptive admission state SIDECAR_ADAPTIVE_* describe (None unless adaptive);
    ``binding`` tells it whether its limit bound lately (the bulkhead's ``pressed``)."""
    if admission_mode(settings) != "adaptive":
        return None
    if settings.adaptive_min_samples > settings.adaptive_window:
        raise ConfigError("SIDECAR_ADAPTIVE_MIN_SAMPLES must not exceed SIDECAR_ADAPTIVE_WINDOW")
    return AdaptiveCapacity(
        estimator=EstimatorConfig(settings.adaptive_min_samples, settings.adaptive_window),
        aimd=AimdConfig(
            low=settings.adaptive_min_overcommit,
            high=settings.adaptive_max_overcommit,
            increase=settings.adaptive_increase,
            decrease=settings.adaptive_decrease,
            target=settings.adaptive_kv_target,
        ),
        binding=binding,
    )


def build_mode(
    settings: Settings,
    adaptive: AdaptiveCapacity | None,
    resolve: Callable[[str], str],
    cost_of: Callable[[], KvCost],
    slo: SloControl | None = None,
) -> AdmissionMode:
    """The admission mode's strategy, chosen once (``adaptive`` and ``slo`` are the laws built
    for theirs); ``cost_of`` prices a token as the plan in force does (tokens mode)."""
    if slo is not None:
        return SloMode(slo, settings.max_concurrent_calls)
    if adaptive is not None:
        return AdaptiveMode(adaptive, resolve)
    if admission_mode(settings) == "tokens":
        return TokenMode(cost_of)
    return CountMode(settings.max_concurrent_calls)


def model_cost(settings: Settings) -> KvCost | None:
    """The model config's pricing; None without SIDECAR_MODEL, where the engine's must do."""
    if not settings.model:
        if settings.capacity_source in ("nvml", "static"):
            msg = (
                f"SIDECAR_MODEL is required with SIDECAR_CAPACITY_SOURCE="
                f"{settings.capacity_source} (a model directory or a preset): only the engine "
                "(auto, vllm, sglang or llamacpp) can price a token without it"
            )
            raise ConfigError(msg)
        return None
    try:
        spec = load_model_spec(settings.model)
    except ConfigError as exc:  # the startup line names the setting
        raise ConfigError(f"SIDECAR_MODEL: {exc}") from exc
    return KvCost(
        spec=spec,
        kv_dtype=settings.kv_dtype,
        tp=settings.tensor_parallel_size,
        block_size=settings.block_size,
    )


def build_controller(
    settings: Settings,
    resize: Callable[[Limits], None],
    mode: AdmissionMode | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    nvml: GpuProbe | None = None,
    http_session: aiohttp.ClientSession | None = None,
    adaptive: AdaptiveCapacity | None = None,
    available: Callable[[bool], None] | None = None,
    observe: Callable[[Readings], None] | None = None,
    slo: SloControl | None = None,
    hurry_while: Callable[[], bool] = lambda: False,
    ticked: Callable[[], None] | None = None,
) -> CapacityController:
    """The controller ``settings`` describe; ``nvml`` replaces the NVML probe (tests, demo).

    ``available`` hears when a plan of 0 permits starts or stops (the bulkhead refuses at once);
    ``observe`` hears each tick's readings (the scale-out signal); ``hurry_while``: whether the
    next tick should come at once (``CapacityController.hurry``); ``ticked`` hears each tick
    that left the limits as they were (``Sinks.ticked``).
    """
    cost = model_cost(settings)
    budget_rule = partial(
        resolve_budget, settings.max_prompt_tokens, settings.max_completion_tokens
    )
    budget = budget_rule(None).plan_budget()  # until the engine says its max_model_len
    sources = sources_of_settings(settings, clock, nvml, http_session)
    if mode is None:  # a controller on its own (sidecar probe): permits, or bytes in tokens mode
        mode = build_mode(settings, adaptive, str, lambda: controller.cost, slo)
    floor = _floor(settings, cost or engine_cost(1, None), budget, sources.declared, mode)
    controller = CapacityController(
        sources=sources,
        planning=Planning(
            cost=cost,
            budget=budget,
            alpha=settings.safety_factor,
            mode=mode,
            floor=floor,
            budget_rule=budget_rule,
        ),
        sinks=Sinks(
            resize=resize,
            available=available,
            feedback=_feedback(adaptive, slo, observe),
            ticked=ticked,
        ),
        cadence=Cadence(
            refresh_s=settings.refresh_ms / 1000,
            stale_after_s=settings.stale_after_ms / 1000,
            probe_timeout_s=settings.probe_timeout_ms / 1000,
            clock=clock,
            hurry_while=hurry_while,
        ),
    )
    return controller


def sources_of_settings(
    settings: Settings,
    clock: Callable[[], float],
    nvml: GpuProbe | None = None,
    http_session: aiohttp.ClientSession | None = None,
) -> Sources:
    """What the controller reads: the declared numbers, and NVML and the engine's /metrics
    unless SIDECAR_CAPACITY_SOURCE=static."""
    sources = Sources(
        requested=settings.capacity_source,
        declared=declared_from(settings, clock()),
        engine_pid=settings.engine_pid,
        tolerance=settings.disagreement_tolerance,
    )
    if settings.capacity_source == "static":
        return sources
    upstream = settings.upstream_url.rstrip("/")
    engine_probe = EngineMetricsProbe(
        settings.engine_metrics_url or upstream + "/metrics",
        engine=settings.capacity_source if settings.capacity_source in ENGINES else "auto",
        base_url=upstream,
        session=http_session,
        clock=clock,
        llamacpp_kv_unified=settings.llamacpp_kv_unified,
    )
    gpu_probe = nvml or NvmlProbe(parse_gpu_selection(settings.gpus), clock=clock)
    return replace(sources, gpu_probe=gpu_probe, engine_probe=engine_probe)


def _feedback(
    adaptive: AdaptiveCapacity | None,
    slo: SloControl | None,
    observe: Callable[[Readings], None] | None,
) -> Callable[[Readings], tuple[ConfigWarning, ...]] | None:
    """What hears each tick's readings: the mode's controller, slo or adaptive, where it has
    one (its warnings are returned), then ``observe``."""
    control = slo.observe if slo is not None else adaptive.observe if adaptive is not None else None
    if observe is None:
        return control

    def feedback(readings: Readings) -> tuple[ConfigWarning, ...]:
        warnings = control(readings) if control is not None else ()
        observe(readings)
        return warnings

    return feedback


def _floor(
    settings: Settings,
    cost: KvCost,
    budget: Budget,
    declared: Declared,
    mode: AdmissionMode,
) -> Floor:
    """SIDECAR_FLOOR_PERMITS, else the static plan where one is declared, else one request."""
    per_request = mode.full_request(budget.total, cost)
    if settings.floor_permits is not None:
        return Floor(None, settings.floor_permits * per_request)
    if declared.plannable:
        plan = make_plan(cost, static_memory(declared), budget, settings.safety_factor)
        limits = mode.step(plan)
        return Floor(plan, limits.limit, limits.in_flight)
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
        memory_fraction=settings.engine_memory_fraction,
    )


def _measure(model_dir: Path, weights_in: Callable[[Path], int] | None) -> int | None:
    """The weight files' size; None (not fatal: the engine source needs no weights) if none."""
    try:
        size = (weights_in or weights_bytes_in)(model_dir)
    except ConfigError:
        return None
    return size if size > 0 else None


def prompt_counter(settings: Settings, upstream: EnginePool) -> EnginePromptCounter | None:
    """The engine's prompt count where SIDECAR_PROMPT_TOKENS=engine: within its own deadline, a
    share per client address, and half the pre-admission gate in all."""
    if settings.prompt_tokens != "engine":
        return None
    return EnginePromptCounter(
        upstream,
        timeout_s=settings.tokenize_timeout_ms / 1000,
        per_client=settings.tokenize_per_client,
        limit=max(1, settings.max_pre_admission // 2),
    )


def overload_manager(settings: Settings, port: Port) -> OverloadManager | None:
    """The overload manager of the proxy port, where something is watched
    (SIDECAR_OVERLOAD_MEMORY, SIDECAR_OVERLOAD_LOOP_LAG_MS); None where nothing is."""
    memory, lag_ms = settings.overload_memory, settings.overload_loop_lag_ms
    if memory is None and lag_ms == 0:
        return None
    thresholds = OverloadThresholds(
        memory_bytes=int(memory) if memory is not None else None,
        stop_accepting=settings.overload_stop_accepting,
        shed=settings.overload_shed,
        loop_lag_s=lag_ms / 1000 if lag_ms else None,
    )
    return OverloadManager(thresholds, port)
