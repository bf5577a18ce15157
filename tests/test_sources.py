"""Capacity sources: which one auto picks, and the pool each derives from its readings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sidecar.core.errors import ProbeTemporaryError, ProbeUnavailableError
from sidecar.core.model.model_spec import load_model_spec
from sidecar.core.plan.capacity import (
    Budget,
    KvCost,
    MemoryFraction,
    MemoryInputs,
    Source,
    Term,
    make_plan,
)
from sidecar.live.declared_memory import static_memory
from sidecar.live.engine_pricing import engine_pricing
from sidecar.live.probes import (
    EngineCacheConfig,
    EngineReading,
    GpuReading,
    GpuSnapshot,
    ProcessMemory,
)
from sidecar.live.sources import (
    PlanInputs,
    Readings,
    memory_fraction,
    pick_source,
    plan_inputs,
)
from tests.declared import declared

TINY = Path(__file__).parent / "configs" / "tiny-llama.json"

GIB = 1024**3
COST = KvCost(spec=load_model_spec("qwen2.5-7b"))  # 57,344 B/token
DECLARED = declared(weights_bytes=14 * GIB, weights_measured=True, overhead_bytes=2 * GIB)
CACHE = EngineCacheConfig(
    num_gpu_blocks=None,
    block_size=16,
    kv_cache_size_tokens=100_000,
    kv_cache_memory_bytes=None,
    cache_dtype="auto",
    gpu_memory_utilization=0.9,
)


def gpu(uuid: str, used: int, *procs: tuple[int, int]) -> GpuReading:
    listed = tuple(ProcessMemory(pid, size) for pid, size in procs)
    return GpuReading(0, uuid, "GPU", 80 * GIB, used, 80 * GIB - used, None, listed, False)


def engine(cache: EngineCacheConfig | None = CACHE) -> EngineReading:
    return EngineReading(
        cache=cache,
        kv_usage_ratio=0.1,
        requests_running=1.0,
        requests_waiting=0.0,
        preemptions_total=0.0,
        observed_at=5.0,
    )


def snapshot(*gpus: GpuReading) -> GpuSnapshot:
    return GpuSnapshot(gpus, observed_at=4.0)


@pytest.mark.parametrize(
    ("readings", "picked"),
    [
        pytest.param(
            Readings(declared=DECLARED, gpus=snapshot(gpu("a", 0)), engine=engine()),
            "vllm",
            id="engine-first",
        ),
        pytest.param(
            Readings(declared=DECLARED, gpus=snapshot(gpu("a", 0)), engine=engine(None)),
            "nvml",
            id="gpu-next",
        ),
        pytest.param(
            Readings(
                declared=declared(vram_total_bytes=8 * GIB, weights_bytes=GIB, overhead_bytes=GIB)
            ),
            "static",
            id="declared-last",
        ),
    ],
)
def test_auto_prefers_engine_then_nvml_then_declared(readings: Readings, picked: str) -> None:
    """auto says which source it used."""
    assert pick_source("auto", readings) == picked


def test_auto_with_nothing_readable_names_every_failure() -> None:
    """The error lists what each probe said."""
    readings = Readings(
        declared=declared(overhead_bytes=GIB),
        gpu_error=ProbeUnavailableError("no driver"),
        engine_error=ProbeTemporaryError("engine down"),
    )
    with pytest.raises(ProbeTemporaryError, match="no driver; engine down"):
        pick_source("auto", readings)


def nvml_inputs(readings: Readings, engine_pid: int | None = None) -> PlanInputs:
    """The nvml source's inputs for ``readings``."""
    return plan_inputs("nvml", readings, COST, engine_pid=engine_pid, tolerance=0.1)


def test_nvml_pool_is_the_engines_share_less_weights_and_overhead() -> None:
    """80 GiB x vLLM's default 0.9 - 14 GiB weights - 2 GiB overhead = 56 GiB; the 6 GiB
    neighbour and 4 GiB nobody lists sit in the 8 GiB the engine leaves free."""
    reading = gpu("a", 40 * GIB, (10, 30 * GIB), (11, 6 * GIB))  # 4 GiB unlisted
    inputs = nvml_inputs(Readings(declared=DECLARED, gpus=snapshot(reading)))
    assert isinstance(inputs.memory, MemoryInputs)
    assert inputs.memory.pool_terms(1)[-1].bytes == 56 * GIB
    assert inputs.memory.engine_share().bytes == 72 * GIB
    assert inputs.memory.fraction == MemoryFraction(0.9, Source.DEFAULT)
    assert inputs.memory.neighbours.bytes == 0
    assert inputs.memory.neighbours.detail == (
        "6,442,450,944 B held by other processes: out of the engine's headroom"
    )
    assert inputs.memory.weights.source is Source.MEASURED
    assert inputs.memory.overhead == Term(
        name="overhead", bytes=2 * GIB, source=Source.DECLARED, observed_at=0.0
    )
    assert [(h.others_bytes, h.left_free_bytes, h.taken_bytes) for h in inputs.headroom] == [
        (6 * GIB, 8 * GIB, 0)
    ]
    assert inputs.warnings == ()


@pytest.mark.parametrize(
    ("declared", "cache", "fraction"),
    [
        pytest.param(None, None, MemoryFraction(0.9, Source.DEFAULT), id="vllm-default"),
        pytest.param(0.5, None, MemoryFraction(0.5, Source.DECLARED), id="setting"),
        pytest.param(
            0.5,
            dataclasses.replace(CACHE, gpu_memory_utilization=0.8),
            MemoryFraction(0.8, Source.ENGINE),
            id="engine-over-setting",
        ),
        pytest.param(
            0.5,
            dataclasses.replace(CACHE, gpu_memory_utilization=None),
            MemoryFraction(0.5, Source.DECLARED),
            id="engine-silent",
        ),
        pytest.param(
            None,
            dataclasses.replace(CACHE, gpu_memory_utilization=0.0),
            MemoryFraction(0.9, Source.DEFAULT),
            id="engine-nonsense",
        ),
    ],
)
def test_memory_fraction_is_the_engines_then_the_setting_then_vllms_default(
    declared: float | None, cache: EngineCacheConfig | None, fraction: MemoryFraction
) -> None:
    """vLLM's cache_config_info gpu_memory_utilization, else SIDECAR_ENGINE_MEMORY_FRACTION."""
    said = dataclasses.replace(DECLARED, memory_fraction=declared)
    reading = None if cache is None else engine(cache)
    assert memory_fraction(Readings(declared=said, engine=reading)) == fraction


def test_static_source_sizes_the_pool_inside_the_engines_share() -> None:
    """SIDECAR_VRAM_TOTAL 80 GiB x SIDECAR_ENGINE_MEMORY_FRACTION 0.5 - 14 - 2 = 24 GiB."""
    said = declared(
        vram_total_bytes=80 * GIB,
        weights_bytes=14 * GIB,
        overhead_bytes=2 * GIB,
        memory_fraction=0.5,
    )
    memory = static_memory(said)
    assert isinstance(memory, MemoryInputs)
    assert memory.pool_terms(1)[-1].bytes == 24 * GIB


def test_a_neighbour_arriving_after_the_engine_takes_headroom_not_pool() -> None:
    """The engine holds its share; a 12 GiB neighbour starts: the pool stays, the headroom
    (8 GiB at 0.9) is 4 GiB short, and the warning says so."""
    before = gpu("a", 70 * GIB, (10, 70 * GIB))
    after = gpu("a", 78 * GIB, (10, 70 * GIB), (11, 12 * GIB))
    plans = [nvml_inputs(Readings(declared=DECLARED, gpus=snapshot(g))) for g in (before, after)]
    pools = [p.memory.pool_terms(1)[-1].bytes for p in plans if isinstance(p.memory, MemoryInputs)]
    assert pools == [56 * GIB, 56 * GIB]
    assert [h.taken_bytes for p in plans for h in p.headroom] == [0, 4 * GIB]
    assert [w.code for w in plans[0].warnings] == []
    [warning] = plans[1].warnings
    assert warning.code == "engine_headroom"
    assert "12,884,901,888 B, more than the 8,589,934,592 B" in warning.message


def test_engine_pid_overrides_the_largest_process() -> None:
    """SIDECAR_ENGINE_PID names the engine; the largest process is then a neighbour."""
    reading = gpu("a", 40 * GIB, (10, 30 * GIB), (11, 6 * GIB))
    inputs = nvml_inputs(Readings(declared=DECLARED, gpus=snapshot(reading)), engine_pid=11)
    assert [h.others_bytes for h in inputs.headroom] == [30 * GIB]


def test_headroom_names_the_gpu_whose_neighbour_reaches_into_the_share() -> None:
    """Two GPUs of a group, a 10 GiB neighbour on the second: its headroom is 2 GiB short."""
    readings = Readings(
        declared=DECLARED,
        gpus=snapshot(
            gpu("a", 20 * GIB, (1, 20 * GIB)), gpu("b", 30 * GIB, (1, 20 * GIB), (2, 10 * GIB))
        ),
    )
    inputs = nvml_inputs(readings)
    assert [(h.gpu, h.taken_bytes) for h in inputs.headroom] == [("a", 0), ("b", 2 * GIB)]
    assert [w.message.split()[1] for w in inputs.warnings] == ["b"]


def test_engine_reports_its_pool_and_overhead_is_measured() -> None:
    """With the engine's pool known, overhead = engine process - weights - pool."""
    pool = 100_000 * 57_344
    engine_proc = 14 * GIB + pool + GIB
    reading = gpu("a", engine_proc + GIB // 2, (1, engine_proc))
    inputs = nvml_inputs(Readings(declared=DECLARED, gpus=snapshot(reading), engine=engine()))
    assert isinstance(inputs.memory, MemoryInputs)
    assert inputs.memory.overhead == Term(
        name="overhead", bytes=GIB, source=Source.MEASURED, observed_at=4.0
    )


UNSEEN = [
    pytest.param((), None, "NVML lists no process at all", id="none-listed"),
    pytest.param(((7, GIB),), None, "the largest process NVML lists holds", id="too-small"),
    pytest.param(((7, 30 * GIB),), 99, "SIDECAR_ENGINE_PID 99 is not among", id="pid-gone"),
]


@pytest.mark.parametrize(("procs", "pid", "why"), UNSEEN)
def test_engine_process_unseen_skips_the_cross_check_and_says_so(
    procs: tuple[tuple[int, int], ...], pid: int | None, why: str
) -> None:
    """NVML stops listing the engine's process while it answers: no -18 GB "disagreement",
    one warning naming what happened."""
    readings = Readings(
        declared=DECLARED, gpus=snapshot(gpu("a", 2 * GIB, *procs)), engine=engine()
    )
    inputs = plan_inputs("vllm", readings, COST, engine_pid=pid, tolerance=0.1)
    assert inputs.memory == Term(
        name="kv_pool", bytes=100_000 * 57_344, source=Source.ENGINE, observed_at=5.0
    )
    assert inputs.disagreements == ()
    [warning] = [w for w in inputs.warnings if w.code == "engine_process_unseen"]
    assert why in warning.message
    assert "on a " in warning.message


def test_nvml_source_keeps_the_declared_overhead_when_the_engine_is_unseen() -> None:
    """With the engine's pool stated but its process unlisted, nothing measures the overhead."""
    inputs = nvml_inputs(
        Readings(declared=DECLARED, gpus=snapshot(gpu("a", 2 * GIB)), engine=engine())
    )
    assert isinstance(inputs.memory, MemoryInputs)
    assert inputs.memory.overhead == Term(
        name="overhead", bytes=2 * GIB, source=Source.DECLARED, observed_at=0.0
    )
    assert [w.code for w in inputs.warnings] == ["engine_process_unseen"]


def test_llamacpp_inferred_pool_measures_no_overhead() -> None:
    """llama.cpp's pool is inferred from one slot's context (maybe capped), so the nvml source
    keeps the declared overhead rather than "measuring" one from it."""
    engine_proc = 14 * GIB + 100_000 * 57_344 + GIB
    reading = gpu("a", engine_proc, (1, engine_proc))
    llama = dataclasses.replace(engine(), engine="llamacpp", slots=4)
    inputs = plan_inputs(
        "nvml",
        Readings(declared=DECLARED, gpus=snapshot(reading), engine=llama),
        COST,
        engine_pid=None,
        tolerance=0.1,
    )
    assert isinstance(inputs.memory, MemoryInputs)
    assert inputs.memory.overhead == Term(
        name="overhead", bytes=2 * GIB, source=Source.DECLARED, observed_at=0.0
    )


def test_auto_names_the_engine_it_planned_from() -> None:
    """An SGLang reading: auto's source is "sglang", planned from the engine's pool."""
    sglang = dataclasses.replace(engine(), engine="sglang", provenance="sglang")
    inputs = plan_inputs(
        "auto", Readings(declared=DECLARED, engine=sglang), COST, engine_pid=None, tolerance=0.1
    )
    assert inputs.source == "sglang"
    assert inputs.memory == Term(
        name="kv_pool", bytes=100_000 * 57_344, source=Source.ENGINE, observed_at=5.0
    )


@pytest.mark.parametrize(
    ("engine_holds", "flagged"),
    [
        pytest.param(14 * GIB + 2 * GIB + 100_000 * 57_344, False, id="agree"),
        pytest.param(14 * GIB + 2 * GIB + 50_000 * 57_344, True, id="engine-claims-double"),
    ],
)
def test_vllm_pool_is_cross_checked_against_nvml(engine_holds: int, flagged: bool) -> None:
    """The engine's pool is the plan's; NVML's view of it is compared within the tolerance."""
    readings = Readings(
        declared=DECLARED, gpus=snapshot(gpu("a", engine_holds, (1, engine_holds))), engine=engine()
    )
    inputs = plan_inputs("vllm", readings, COST, engine_pid=None, tolerance=0.1)
    assert inputs.memory == Term(
        name="kv_pool", bytes=100_000 * 57_344, source=Source.ENGINE, observed_at=5.0
    )
    assert [d.beyond_tolerance for d in inputs.disagreements] == [flagged]


def test_explicit_source_reraises_its_probe_error() -> None:
    """Asking for nvml when NVML failed surfaces NVML's own error."""
    readings = Readings(declared=DECLARED, gpu_error=ProbeTemporaryError("NVML: the GPU is lost"))
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
    cost = KvCost(spec=load_model_spec(str(TINY)), block_size=128)
    priced, warnings = engine_pricing(ENGINE_CACHE, cost, 0.10)
    assert (priced, warnings) == (cost, ())


def test_engine_pricing_overrules_a_wrong_model() -> None:
    """Qwen2.5-7B's 57,344 B/token against the engine's 1,024: the engine's, and a warning."""
    cost = KvCost(spec=load_model_spec("qwen2.5-7b"), block_size=128)
    priced, warnings = engine_pricing(ENGINE_CACHE, cost, 0.10)
    assert priced.bytes_per_token == 1024
    assert priced.block_size == 128
    assert [w.code for w in warnings] == ["model_mismatch"]


def test_engine_pricing_without_a_model() -> None:
    """No model config: the engine's bytes per token and block size price a token."""
    priced, warnings = engine_pricing(ENGINE_CACHE, None, 0.10)
    assert (priced.bytes_per_token, priced.block_size, warnings) == (1024, 128, ())
    plan = make_plan(
        priced, Term(name="kv_pool", bytes=4096 * 1024, source=Source.ENGINE), Budget(256, 512), 0.4
    )
    # 768 tokens = 6 blocks of 128; 4,096 / 768 x 0.4 = 2.13 -> 2 permits
    assert (plan.permits, plan.kv_pool_tokens) == (2, 4096)
