"""Capacity sources: which one auto picks, and the pool each derives from its readings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sidecar.core.capacity import Budget, KvCost, MemoryInputs, Source, Term, make_plan
from sidecar.core.errors import ProbeTemporaryError, ProbeUnavailableError
from sidecar.core.model_spec import load_model_spec
from sidecar.live.probes import (
    EngineCacheConfig,
    EngineReading,
    GpuReading,
    GpuSnapshot,
    ProcessMemory,
)
from sidecar.live.probes.static import Declared
from sidecar.live.sources import Readings, engine_pricing, pick_source, plan_inputs

TINY = Path(__file__).parent / "configs" / "tiny-llama.json"

GIB = 1024**3
COST = KvCost(load_model_spec("qwen2.5-7b"))  # 57,344 B/token
DECLARED = Declared(None, 14 * GIB, True, 2 * GIB, None, observed_at=0.0)
CACHE = EngineCacheConfig(None, 16, 100_000, None, "auto", 0.9)


def gpu(uuid: str, used: int, *procs: tuple[int, int]) -> GpuReading:
    listed = tuple(ProcessMemory(pid, size) for pid, size in procs)
    return GpuReading(0, uuid, "GPU", 80 * GIB, used, 80 * GIB - used, None, listed, False)


def engine(cache: EngineCacheConfig | None = CACHE) -> EngineReading:
    return EngineReading(cache, 0.1, 1.0, 0.0, 0.0, observed_at=5.0)


def snapshot(*gpus: GpuReading) -> GpuSnapshot:
    return GpuSnapshot(gpus, observed_at=4.0)


@pytest.mark.parametrize(
    ("readings", "picked"),
    [
        pytest.param(
            Readings(DECLARED, snapshot(gpu("a", 0)), engine()), "vllm", id="engine-first"
        ),
        pytest.param(
            Readings(DECLARED, snapshot(gpu("a", 0)), engine(None)), "nvml", id="gpu-next"
        ),
        pytest.param(
            Readings(Declared(8 * GIB, GIB, False, GIB, None, 0.0)), "static", id="declared-last"
        ),
    ],
)
def test_auto_prefers_engine_then_nvml_then_declared(readings: Readings, picked: str) -> None:
    """auto says which source it used."""
    assert pick_source("auto", readings) == picked


def test_auto_with_nothing_readable_names_every_failure() -> None:
    """The error lists what each probe said."""
    readings = Readings(
        Declared(None, None, False, GIB, None, 0.0),
        gpu_error=ProbeUnavailableError("no driver"),
        engine_error=ProbeTemporaryError("engine down"),
    )
    with pytest.raises(ProbeTemporaryError, match="no driver; engine down"):
        pick_source("auto", readings)


def test_nvml_pool_subtracts_neighbours_but_not_unlisted_memory() -> None:
    """Largest process is the engine; the other is a neighbour; unlisted memory is not."""
    reading = gpu("a", 40 * GIB, (10, 30 * GIB), (11, 6 * GIB))  # 4 GiB unlisted
    inputs = plan_inputs(
        "nvml", Readings(DECLARED, snapshot(reading)), COST, engine_pid=None, tolerance=0.1
    )
    assert isinstance(inputs.memory, MemoryInputs)
    assert inputs.memory.neighbours == Term("neighbours", 6 * GIB, Source.MEASURED, 4.0)
    assert inputs.memory.weights.source is Source.MEASURED
    assert inputs.memory.overhead == Term("overhead", 2 * GIB, Source.DECLARED, 0.0)


def test_engine_pid_overrides_the_largest_process() -> None:
    """SIDECAR_ENGINE_PID names the engine; the largest process is then a neighbour."""
    reading = gpu("a", 40 * GIB, (10, 30 * GIB), (11, 6 * GIB))
    inputs = plan_inputs(
        "nvml", Readings(DECLARED, snapshot(reading)), COST, engine_pid=11, tolerance=0.1
    )
    assert isinstance(inputs.memory, MemoryInputs)
    assert inputs.memory.neighbours.bytes == 30 * GIB


def test_tensor_parallel_group_is_bounded_by_the_fullest_gpu() -> None:
    """Two GPUs, one with a neighbour: that one's numbers are the plan's."""
    readings = Readings(
        DECLARED,
        snapshot(
            gpu("a", 20 * GIB, (1, 20 * GIB)), gpu("b", 30 * GIB, (1, 20 * GIB), (2, 10 * GIB))
        ),
    )
    inputs = plan_inputs("nvml", readings, COST, engine_pid=None, tolerance=0.1)
    assert isinstance(inputs.memory, MemoryInputs)
    assert inputs.memory.neighbours.bytes == 10 * GIB


def test_engine_reports_its_pool_and_overhead_is_measured() -> None:
    """With the engine's pool known, overhead = engine process - weights - pool + unlisted."""
    pool = 100_000 * 57_344
    engine_proc = 14 * GIB + pool + GIB
    reading = gpu("a", engine_proc + GIB // 2, (1, engine_proc))
    inputs = plan_inputs(
        "nvml",
        Readings(DECLARED, snapshot(reading), engine()),
        COST,
        engine_pid=None,
        tolerance=0.1,
    )
    assert isinstance(inputs.memory, MemoryInputs)
    assert inputs.memory.overhead == Term("overhead", GIB + GIB // 2, Source.MEASURED, 4.0)


def test_llamacpp_inferred_pool_measures_no_overhead() -> None:
    """llama.cpp's pool is inferred from one slot's context (maybe capped), so the nvml source
    keeps the declared overhead rather than "measuring" one from it."""
    engine_proc = 14 * GIB + 100_000 * 57_344 + GIB
    reading = gpu("a", engine_proc, (1, engine_proc))
    llama = dataclasses.replace(engine(), engine="llamacpp", slots=4)
    inputs = plan_inputs(
        "nvml", Readings(DECLARED, snapshot(reading), llama), COST, engine_pid=None, tolerance=0.1
    )
    assert isinstance(inputs.memory, MemoryInputs)
    assert inputs.memory.overhead == Term("overhead", 2 * GIB, Source.DECLARED, 0.0)


def test_auto_names_the_engine_it_planned_from() -> None:
    """An SGLang reading: auto's source is "sglang", planned from the engine's pool."""
    sglang = dataclasses.replace(engine(), engine="sglang", provenance="sglang")
    inputs = plan_inputs(
        "auto", Readings(DECLARED, engine=sglang), COST, engine_pid=None, tolerance=0.1
    )
    assert inputs.source == "sglang"
    assert inputs.memory == Term("kv_pool", 100_000 * 57_344, Source.ENGINE, 5.0)


@pytest.mark.parametrize(
    ("engine_holds", "flagged"),
    [
        pytest.param(14 * GIB + 2 * GIB + 100_000 * 57_344, False, id="agree"),
        pytest.param(14 * GIB + 2 * GIB + 50_000 * 57_344, True, id="engine-claims-double"),
    ],
)
def test_vllm_pool_is_cross_checked_against_nvml(engine_holds: int, flagged: bool) -> None:
    """The engine's pool is the plan's; NVML's view of it is compared within the tolerance."""
    readings = Readings(DECLARED, snapshot(gpu("a", engine_holds, (1, engine_holds))), engine())
    inputs = plan_inputs("vllm", readings, COST, engine_pid=None, tolerance=0.1)
    assert inputs.memory == Term("kv_pool", 100_000 * 57_344, Source.ENGINE, 5.0)
    assert [d.beyond_tolerance for d in inputs.disagreements] == [flagged]


def test_explicit_source_reraises_its_probe_error() -> None:
    """Asking for nvml when NVML failed surfaces NVML's own error."""
    readings = Readings(DECLARED, gpu_error=ProbeTemporaryError("NVML: the GPU is lost"))
    with pytest.raises(ProbeTemporaryError, match="the GPU is lost"):
        plan_inputs("nvml", readings, COST, engine_pid=None, tolerance=0.1)


ENGINE_CACHE = EngineCacheConfig(
    num_gpu_blocks=32,
    block_size=128,
    kv_cache_size_tokens=4096,
    kv_cache_memory_bytes=4 * 1024 * 1024,
    cache_dtype="auto",
    gpu_memory_utilization=None,
)


def test_engine_pricing_keeps_an_agreeing_model_config() -> None:
    """The tiny model's 1,024 B/token agree with 4 MiB / 4,096 tokens: the config prices."""
    cost = KvCost(load_model_spec(str(TINY)), block_size=128)
    priced, warnings = engine_pricing(ENGINE_CACHE, cost, 0.10)
    assert (priced, warnings) == (cost, ())


def test_engine_pricing_overrules_a_wrong_model() -> None:
    """Qwen2.5-7B's 57,344 B/token against the engine's 1,024: the engine's, and a warning."""
    cost = KvCost(load_model_spec("qwen2.5-7b"), block_size=128)
    priced, warnings = engine_pricing(ENGINE_CACHE, cost, 0.10)
    assert priced.bytes_per_token == 1024
    assert priced.block_size == 128
    assert [w.code for w in warnings] == ["model_mismatch"]


def test_engine_pricing_without_a_model() -> None:
    """No model config: the engine's bytes per token and block size price a token."""
    priced, warnings = engine_pricing(ENGINE_CACHE, None, 0.10)
    assert (priced.bytes_per_token, priced.block_size, warnings) == (1024, 128, ())
    plan = make_plan(priced, Term("kv_pool", 4096 * 1024, Source.ENGINE), Budget(256, 512), 0.4)
    # 768 tokens = 6 blocks of 128; 4,096 / 768 x 0.4 = 2.13 -> 2 permits
    assert (plan.permits, plan.kv_pool_tokens) == (2, 4096)
