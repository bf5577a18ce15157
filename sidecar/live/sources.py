"""Turn probe readings into plan inputs, per ``SIDECAR_CAPACITY_SOURCE``
(auto|nvml|vllm|sglang|llamacpp|static).

Pure: readings in, :class:`PlanInputs` out; every term names where its number came from.
- nvml:   pool = total x the engine's memory fraction - weights - overhead, on the fullest GPU;
- vllm, sglang, llamacpp: pool = the engine's own KV pool, cross-checked against what NVML sees
  it hold (auto names the engine the probe found);
- static: the declared numbers, sized the same way.
Neighbours never shrink the pool: they take the share the engine leaves free (its headroom), and
:mod:`sidecar.live.headroom` reports when they take more.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sidecar.core.errors import ProbeError, ProbeTemporaryError, ProbeUnavailableError
from sidecar.core.plan.capacity import (
    KvCost,
    MemoryFraction,
    MemoryInputs,
    Source,
    Term,
)
from sidecar.core.warnings import ConfigWarning, engine_process_unseen
from sidecar.live.declared_memory import declared_fraction, static_memory, weights_term
from sidecar.live.engine_pricing import engine_pool_per_gpu, engine_pricing
from sidecar.live.engine_process import engine_process_bytes, neighbour_bytes, seen_engine_bytes
from sidecar.live.headroom import Headroom, headroom, headroom_warnings
from sidecar.live.probes import EngineReading, GpuReading, GpuSnapshot
from sidecar.live.probes.static import Declared

ENGINE_SOURCES = ("vllm", "sglang", "llamacpp")
__all__ = ["engine_process_bytes", "neighbour_bytes"]  # where callers have long found them


@dataclass(frozen=True, kw_only=True)
class Readings:
    """One tick's observations; a probe that failed leaves its error instead of a reading."""

    declared: Declared
    gpus: GpuSnapshot | None = None
    engine: EngineReading | None = None
    gpu_error: ProbeError | None = None
    engine_error: ProbeError | None = None


@dataclass(frozen=True, kw_only=True)
class Disagreement:
    """The engine's KV pool against what NVML sees the engine hold for it, on one GPU."""

    gpu: str
    engine_bytes: int
    nvml_bytes: int
    ratio: float
    beyond_tolerance: bool


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """What make_plan needs, and which source chose it."""

    source: str
    memory: MemoryInputs | Term
    cost: KvCost
    disagreements: tuple[Disagreement, ...] = ()
    warnings: tuple[ConfigWarning, ...] = ()
    headroom: tuple[Headroom, ...] = ()


def memory_fraction(readings: Readings) -> MemoryFraction:
    """The share of each GPU the engine sizes itself to: the engine's own (vLLM's
    ``gpu_memory_utilization``), else SIDECAR_ENGINE_MEMORY_FRACTION, else vLLM's default 0.9."""
    cache = readings.engine.cache if readings.engine is not None else None
    said = None if cache is None else cache.gpu_memory_utilization
    # A figure outside (0, 1] is not a fraction vLLM would run with: the setting stands instead.
    if said is not None and 0 < said <= 1:
        return MemoryFraction(said, Source.ENGINE)
    return declared_fraction(readings.declared)


def pick_source(wanted: str, readings: Readings) -> str:
    """The source to plan from; ``auto`` prefers the engine's truth, then NVML, then declared."""
    if wanted != "auto":
        return wanted
    if readings.engine is not None and readings.engine.cache is not None:
        return readings.engine.engine
    if readings.gpus is not None and readings.declared.weights_bytes is not None:
        return "nvml"
    if readings.declared.plannable:
        return "static"
    reasons = [str(e) for e in (readings.gpu_error, readings.engine_error) if e is not None]
    msg = "no capacity source can be read: " + ("; ".join(reasons) or "nothing configured")
    raise ProbeTemporaryError(msg)


def plan_inputs(
    wanted: str,
    readings: Readings,
    cost: KvCost | None,
    *,
    engine_pid: int | None,
    tolerance: float,
) -> PlanInputs:
    """Plan inputs from ``readings``, with each GPU's headroom; raises the failed probe's
    ProbeError when it is needed.

    ``cost`` is the model config's pricing (None without SIDECAR_MODEL: only the engine's
    numbers can size requests then).
    """
    inputs = _inputs(pick_source(wanted, readings), readings, cost, engine_pid, tolerance)
    rooms = headroom(readings.gpus, memory_fraction(readings), engine_pid)
    return replace(inputs, headroom=rooms, warnings=inputs.warnings + headroom_warnings(rooms))


def _inputs(
    source: str, readings: Readings, cost: KvCost | None, engine_pid: int | None, tolerance: float
) -> PlanInputs:
    if source in ENGINE_SOURCES:
        return _from_engine(readings, cost, engine_pid, tolerance)
    if cost is None:
        msg = f"the {source} capacity source needs SIDECAR_MODEL to price a token"
        raise ProbeUnavailableError(msg)
    if source == "nvml":
        memory, unseen = _from_nvml(readings, cost, engine_pid)
        return PlanInputs(source="nvml", memory=memory, cost=cost, warnings=unseen)
    return PlanInputs(source="static", memory=static_memory(readings.declared), cost=cost)


def _from_engine(
    readings: Readings, cost: KvCost | None, engine_pid: int | None, tolerance: float
) -> PlanInputs:
    engine = readings.engine
    if engine is None or engine.cache is None:
        raise readings.engine_error or ProbeTemporaryError("the engine reports no KV cache config")
    priced, warnings = engine_pricing(engine.cache, cost, tolerance)
    pool = engine_pool_per_gpu(engine.cache, priced)
    if pool is None:
        raise ProbeTemporaryError(f"{engine.engine} states no KV pool size")
    checks, unseen = _cross_check(readings, priced, pool, engine_pid, tolerance)
    term = Term(name="kv_pool", bytes=pool, source=Source.ENGINE, observed_at=engine.observed_at)
    return PlanInputs(
        source=engine.engine,
        memory=term,
        cost=priced,
        disagreements=checks,
        warnings=warnings + unseen,
    )


def _cross_check(
    readings: Readings, cost: KvCost, pool: int, engine_pid: int | None, tolerance: float
) -> tuple[tuple[Disagreement, ...], tuple[ConfigWarning, ...]]:
    """NVML's view of the engine's pool: what its process holds beyond weights and overhead; a
    GPU where NVML lists no process that can be the engine gets a warning instead of a number."""
    declared = readings.declared
    if readings.gpus is None or declared.weights_bytes is None or pool <= 0:
        return (), ()
    weights = declared.weights_bytes // cost.tp
    found, unseen = [], []
    for gpu in readings.gpus.gpus:
        held = seen_engine_bytes(gpu, engine_pid, weights)
        if held is None:
            unseen.append(gpu)
            continue
        seen = held - weights - declared.overhead_bytes
        ratio = abs(pool - seen) / pool
        found.append(
            Disagreement(
                gpu=gpu.uuid,
                engine_bytes=pool,
                nvml_bytes=seen,
                ratio=ratio,
                beyond_tolerance=ratio > tolerance,
            )
        )
    warnings = (_unseen_warning(unseen, engine_pid, weights),) if unseen else ()
    return tuple(found), warnings


def _unseen_warning(
    gpus: list[GpuReading], engine_pid: int | None, weights_per_gpu: int
) -> ConfigWarning:
    largest = max((p.used_bytes or 0 for g in gpus for p in g.processes), default=0)
    return engine_process_unseen([g.uuid for g in gpus], engine_pid, largest, weights_per_gpu)


def _from_nvml(
    readings: Readings, cost: KvCost, engine_pid: int | None
) -> tuple[MemoryInputs, tuple[ConfigWarning, ...]]:
    gpus, declared = readings.gpus, readings.declared
    if gpus is None:
        raise readings.gpu_error or ProbeTemporaryError("no GPU reading")
    if not gpus.gpus:
        raise ProbeUnavailableError("NVML sees no GPU")
    if declared.weights_bytes is None:
        msg = "the nvml source needs the weights: SIDECAR_MODEL as a directory or SIDECAR_WEIGHTS"
        raise ProbeUnavailableError(msg)
    engine_pool = None
    engine = readings.engine
    # llama.cpp's pool is inferred from one slot's context, which may be capped below what it
    # allocated: no measurement to take the overhead from.
    if engine is not None and engine.cache is not None and engine.engine != "llamacpp":
        engine_pool = engine_pool_per_gpu(engine.cache, cost)
    weights_per_gpu = declared.weights_bytes // cost.tp
    fraction = memory_fraction(readings)
    options, unseen = [], []
    for gpu in gpus.gpus:
        held = seen_engine_bytes(gpu, engine_pid, weights_per_gpu)
        overhead = Term(
            name="overhead",
            bytes=declared.overhead_bytes,
            source=Source.DECLARED,
            observed_at=declared.observed_at,
        )
        if engine_pool is not None and held is None:
            unseen.append(gpu)
        elif engine_pool is not None and held is not None:
            # What the engine's process holds beyond its weights and its pool.
            measured = max(0, held - weights_per_gpu - engine_pool)
            overhead = Term(
                name="overhead",
                bytes=measured,
                source=Source.MEASURED,
                observed_at=gpus.observed_at,
            )
        options.append(_gpu_inputs(gpu, gpus.observed_at, declared, fraction, overhead, engine_pid))
    warnings = (_unseen_warning(unseen, engine_pid, weights_per_gpu),) if unseen else ()
    return min(options, key=_pool_of), warnings


def _gpu_inputs(  # noqa: PLR0917
    gpu: GpuReading,
    at: float,
    declared: Declared,
    fraction: MemoryFraction,
    overhead: Term,
    engine_pid: int | None,
) -> MemoryInputs:
    """One GPU's terms. Neighbours come out of the engine's headroom, not its pool: their term
    is 0 and names what they hold."""
    others = neighbour_bytes(gpu, engine_pid)
    held = f"{others:,} B held by other processes: out of the engine's headroom"
    return MemoryInputs(
        vram_total=Term(
            name="vram_total", bytes=gpu.total_bytes, source=Source.MEASURED, observed_at=at
        ),
        weights=weights_term(declared),
        overhead=overhead,
        neighbours=Term(
            name="neighbours",
            bytes=0,
            source=Source.MEASURED,
            observed_at=at,
            detail=held if others else None,
        ),
        fraction=fraction,
    )


def _pool_of(inputs: MemoryInputs) -> int:
    """Per-GPU room left; the group is bounded by the GPU with the least."""
    return inputs.engine_share().bytes - inputs.overhead.bytes - inputs.neighbours.bytes
