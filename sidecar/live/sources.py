"""Turn probe readings into plan inputs, per ``SIDECAR_CAPACITY_SOURCE``
(auto|nvml|vllm|sglang|llamacpp|static).

Pure: readings in, :class:`PlanInputs` out; every term names where its number came from.
- nvml:   pool = total - weights - overhead - neighbours, on the fullest GPU of the group;
- vllm, sglang, llamacpp: pool = the engine's own KV pool, cross-checked against what NVML sees
  it hold (auto names the engine the probe found);
- static: the declared numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.capacity import KvCost, MemoryInputs, Source, Term, engine_cost
from sidecar.core.errors import ProbeError, ProbeTemporaryError, ProbeUnavailableError
from sidecar.core.warnings import ConfigWarning, model_mismatch
from sidecar.live.probes import EngineCacheConfig, EngineReading, GpuReading, GpuSnapshot
from sidecar.live.probes.static import Declared

ENGINE_SOURCES = ("vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class Readings:
    """One tick's observations; a probe that failed leaves its error instead of a reading."""

    declared: Declared
    gpus: GpuSnapshot | None = None
    engine: EngineReading | None = None
    gpu_error: ProbeError | None = None
    engine_error: ProbeError | None = None


@dataclass(frozen=True)
class Disagreement:
    """The engine's KV pool against what NVML sees the engine hold for it, on one GPU."""

    gpu: str
    engine_bytes: int
    nvml_bytes: int
    ratio: float
    beyond_tolerance: bool


@dataclass(frozen=True)
class PlanInputs:
    """What make_plan needs, and which source chose it."""

    source: str
    memory: MemoryInputs | Term
    cost: KvCost
    disagreements: tuple[Disagreement, ...] = ()
    warnings: tuple[ConfigWarning, ...] = ()


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
    """Plan inputs from ``readings``; raises the failed probe's ProbeError when it is needed.

    ``cost`` is the model config's pricing (None without SIDECAR_MODEL: only the engine's
    numbers can size requests then).
    """
    source = pick_source(wanted, readings)
    if source in ENGINE_SOURCES:
        return _from_engine(readings, cost, engine_pid, tolerance)
    if cost is None:
        msg = f"the {source} capacity source needs SIDECAR_MODEL to price a token"
        raise ProbeUnavailableError(msg)
    if source == "nvml":
        return PlanInputs("nvml", _from_nvml(readings, cost, engine_pid), cost)
    return PlanInputs("static", static_memory(readings.declared), cost)


def static_memory(declared: Declared) -> MemoryInputs | Term:
    """The declared numbers as plan inputs (the static source, and the floor)."""
    if declared.kv_pool_bytes is not None:
        return Term("kv_pool", declared.kv_pool_bytes, Source.DECLARED, declared.observed_at)
    if declared.vram_total_bytes is None or declared.weights_bytes is None:
        msg = "the static source needs SIDECAR_KV_POOL, or SIDECAR_VRAM_TOTAL and the weights"
        raise ProbeUnavailableError(msg)
    at = declared.observed_at
    return MemoryInputs(
        vram_total=Term("vram_total", declared.vram_total_bytes, Source.DECLARED, at),
        weights=_weights_term(declared),
        overhead=Term("overhead", declared.overhead_bytes, Source.DECLARED, at),
        neighbours=Term("neighbours", 0, Source.DECLARED, at),
    )


def engine_pool_per_gpu(cache: EngineCacheConfig, cost: KvCost) -> int | None:
    """The engine's KV pool on one GPU: its token count x our bytes/token, else its own bytes."""
    if cache.kv_cache_size_tokens is not None:
        return cache.kv_cache_size_tokens * cost.bytes_per_token_per_gpu
    if cache.num_gpu_blocks is not None and cache.block_size is not None:
        return cache.num_gpu_blocks * cache.block_size * cost.bytes_per_token_per_gpu
    return cache.kv_cache_memory_bytes


def engine_process_bytes(gpu: GpuReading, engine_pid: int | None) -> int:
    """What the engine holds: SIDECAR_ENGINE_PID's process, else the largest; all if none listed."""
    sizes = {p.pid: p.used_bytes or 0 for p in gpu.processes}
    if engine_pid is not None and engine_pid in sizes:
        return sizes[engine_pid]
    return max(sizes.values()) if sizes else gpu.used_bytes


def neighbour_bytes(gpu: GpuReading, engine_pid: int | None) -> int:
    """Memory held by listed processes other than the engine (unlisted memory is overhead)."""
    listed = sum(p.used_bytes or 0 for p in gpu.processes)
    return max(0, listed - engine_process_bytes(gpu, engine_pid)) if gpu.processes else 0


def engine_pool_tokens(cache: EngineCacheConfig) -> int | None:
    """The engine's pool in tokens: kv_cache_size_tokens, else num_gpu_blocks x block_size."""
    return cache.pool_tokens


def engine_bytes_per_token(cache: EngineCacheConfig) -> int | None:
    """What the engine's allocator spends per token: kv_cache_memory_bytes / its tokens."""
    return cache.bytes_per_token


def engine_pricing(
    cache: EngineCacheConfig, cost: KvCost | None, tolerance: float
) -> tuple[KvCost, tuple[ConfigWarning, ...]]:
    """The cost to plan with: the model config's where it agrees with the engine, else the
    engine's own bytes per token (and a model_mismatch warning when they disagree)."""
    engine_bytes = engine_bytes_per_token(cache)
    if cost is None:
        if engine_bytes is None and engine_pool_tokens(cache) is None:
            raise ProbeUnavailableError("the engine gives no pool in tokens; set SIDECAR_MODEL")
        # Tokens without bytes: plan in tokens, each counted as one byte.
        return engine_cost(engine_bytes or 1, cache.block_size), ()
    block = cost.block_size
    if engine_bytes is None:
        return cost, ()
    ours = cost.bytes_per_token_per_gpu
    if abs(ours - engine_bytes) / engine_bytes <= tolerance:
        return cost, ()
    return engine_cost(engine_bytes, block, cost.spec.name), (
        model_mismatch(ours, engine_bytes, tolerance),
    )


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
    checks = _cross_check(readings, priced, pool, engine_pid, tolerance)
    term = Term("kv_pool", pool, Source.ENGINE, engine.observed_at)
    return PlanInputs(engine.engine, term, priced, checks, warnings)


def _cross_check(
    readings: Readings, cost: KvCost, pool: int, engine_pid: int | None, tolerance: float
) -> tuple[Disagreement, ...]:
    """NVML's view of the engine's pool: what its process holds beyond weights and overhead."""
    declared = readings.declared
    if readings.gpus is None or declared.weights_bytes is None or pool <= 0:
        return ()
    weights = declared.weights_bytes // cost.tp
    found = []
    for gpu in readings.gpus.gpus:
        seen = engine_process_bytes(gpu, engine_pid) - weights - declared.overhead_bytes
        ratio = abs(pool - seen) / pool
        found.append(Disagreement(gpu.uuid, pool, seen, ratio, ratio > tolerance))
    return tuple(found)


def _from_nvml(readings: Readings, cost: KvCost, engine_pid: int | None) -> MemoryInputs:
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
    at = gpus.observed_at
    options = [
        _gpu_inputs(
            g, at, declared=declared, cost=cost, engine_pid=engine_pid, engine_pool=engine_pool
        )
        for g in gpus.gpus
    ]
    return min(options, key=_pool_of)


def _gpu_inputs(
    gpu: GpuReading,
    at: float,
    *,
    declared: Declared,
    cost: KvCost,
    engine_pid: int | None,
    engine_pool: int | None,
) -> MemoryInputs:
    overhead = Term("overhead", declared.overhead_bytes, Source.DECLARED, declared.observed_at)
    if engine_pool is not None and gpu.processes:
        weights_per_gpu = (declared.weights_bytes or 0) // cost.tp
        beyond = engine_process_bytes(gpu, engine_pid) - weights_per_gpu
        measured = max(0, beyond - engine_pool) + gpu.unlisted_bytes
        overhead = Term("overhead", measured, Source.MEASURED, at)
    return MemoryInputs(
        vram_total=Term("vram_total", gpu.total_bytes, Source.MEASURED, at),
        weights=_weights_term(declared),
        overhead=overhead,
        neighbours=Term("neighbours", neighbour_bytes(gpu, engine_pid), Source.MEASURED, at),
    )


def _pool_of(inputs: MemoryInputs) -> int:
    """Per-GPU room left; the group is bounded by the GPU with the least."""
    return inputs.vram_total.bytes - inputs.overhead.bytes - inputs.neighbours.bytes


def _weights_term(declared: Declared) -> Term:
    source = Source.MEASURED if declared.weights_measured else Source.DECLARED
    return Term("weights", declared.weights_bytes or 0, source, declared.observed_at)
