"""The capacity control loop: grow, shrink, stale -> floor -> recovery, with an injected clock."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from sidecar.core.admission.modes import AdmissionMode, CountMode, SloMode
from sidecar.core.errors import ProbeError, ProbeTemporaryError
from sidecar.core.limits import Limits
from sidecar.core.model.model_spec import load_model_spec
from sidecar.core.plan.capacity import Budget, KvCost, Plan
from sidecar.entry.settings import load_settings
from sidecar.entry.wiring import build_controller
from sidecar.live.control_loop import (
    HURRY_GAP_S,
    TASK_NAME,
    Cadence,
    CapacityController,
    Floor,
    Planning,
    Sinks,
    Sources,
)
from sidecar.live.probes import (
    EngineCacheConfig,
    EngineReading,
    GpuReading,
    GpuSnapshot,
    ProcessMemory,
)
from sidecar.telemetry.capacity_metrics import capacity_json, register_capacity_metrics
from tests.declared import NOTHING_DECLARED, declared
from tests.quiet_law import QuietLaw

GIB = 1024**3
REQUEST = 229_376_000  # qwen2.5-7b, 4,000 tokens, fp16: 57,344 B/token


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class ScriptedGpu:
    """A GPU probe whose next reading (or failure) the test sets."""

    def __init__(self, used_by_neighbour: int = 0) -> None:
        self.neighbour = used_by_neighbour
        self.failure: ProbeError | None = None
        self.closed = False

    async def read(self) -> GpuSnapshot:
        if self.failure is not None:
            raise self.failure
        procs = (ProcessMemory(1, 5 * GIB), ProcessMemory(2, self.neighbour))
        gpu = GpuReading(0, "GPU-0", "Test GPU", 8 * GIB, 0, 0, None, procs, mig_enabled=False)
        return GpuSnapshot((gpu,), observed_at=0.0)

    async def close(self) -> None:
        self.closed = True


# The textbook 8 GiB example, where the engine takes the whole card (memory fraction 1).
TEXTBOOK = declared(weights_bytes=5 * GIB, overhead_bytes=3 * GIB // 2, memory_fraction=1.0)


def qwen(mode: AdmissionMode) -> Planning:
    """Qwen2.5-7B at 3,000 + 1,000 tokens, alpha 0.8, a floor of one, under ``mode``."""
    cost = KvCost(spec=load_model_spec("qwen2.5-7b"))
    return Planning(
        cost=cost, budget=Budget(3000, 1000), alpha=0.8, mode=mode, floor=Floor(None, 1)
    )


def controller(
    gpu: ScriptedGpu, clock: Clock, resized: list[Limits], **cadence: Any
) -> CapacityController:
    """The textbook card under count mode; ``cadence`` overrides the loop's timing."""
    return CapacityController(
        sources=Sources(requested="nvml", declared=TEXTBOOK, gpu_probe=gpu),
        planning=qwen(CountMode()),
        sinks=Sinks(resize=resized.append),
        cadence=Cadence(stale_after_s=10.0, clock=clock, **cadence),
    )


async def test_first_refresh_plans_the_worked_example() -> None:
    """8 GiB card, 5 GiB weights, 1.5 GiB overhead: five permits, handed to the bulkhead."""
    resized: list[Limits] = []
    loop = controller(ScriptedGpu(), Clock(), resized)
    state = await loop.refresh()
    assert (state.plan is not None, state.limit, state.mode) == (True, 5, "fresh")
    assert resized == [Limits(limit=5)]


async def test_a_tick_that_changes_nothing_is_still_heard() -> None:
    """The limits are pushed only when they change; every other tick is told as such, so the
    bulkhead can judge its waiters against what the law learnt (``Sinks.ticked``)."""
    resized: list[Limits] = []
    ticks: list[int] = []
    loop = CapacityController(
        sources=Sources(requested="nvml", declared=TEXTBOOK, gpu_probe=ScriptedGpu()),
        planning=qwen(CountMode()),
        sinks=Sinks(resize=resized.append, ticked=lambda: ticks.append(len(resized))),
        cadence=Cadence(stale_after_s=10.0, clock=Clock()),
    )
    for _ in range(3):
        await loop.refresh()
    assert resized == [Limits(limit=5)]
    assert ticks == [1, 1]


async def test_a_neighbour_takes_headroom_not_permits() -> None:
    """A neighbour taking 0.5 GiB of a card the engine holds whole leaves the pool alone: one
    engine_headroom warning while it stays, cleared when it leaves, never a resize."""
    gpu, resized = ScriptedGpu(), list[Limits]()
    loop = controller(gpu, Clock(), resized)
    await loop.refresh()
    gpu.neighbour = GIB // 2
    with capture_logs() as logs:
        await loop.refresh()
        await loop.refresh()
        taken = [h.taken_bytes for h in loop.state.headroom]
        gpu.neighbour = 0
        await loop.refresh()
    assert resized == [Limits(limit=5)]
    assert taken == [GIB // 2]
    assert [(e["event"], e["code"]) for e in logs] == [
        ("config_warning_raised", "engine_headroom"),
        ("config_warning_cleared", "engine_headroom"),
    ]


async def test_failed_read_keeps_the_plan_then_floors_then_recovers() -> None:
    """Stale inside the grace period, the floor after it, fresh again when the GPU is back."""
    gpu, clock, resized = ScriptedGpu(), Clock(), list[Limits]()
    loop = controller(gpu, clock, resized)
    await loop.refresh()
    gpu.failure = ProbeTemporaryError("NVML: the GPU is lost")
    clock.now += 5
    stale = await loop.refresh()
    clock.now += 6
    floored = await loop.refresh()
    gpu.failure = None
    recovered = await loop.refresh()
    assert [(s.mode, s.limit) for s in (stale, floored, recovered)] == [
        ("stale", 5),
        ("floor", 1),
        ("fresh", 5),
    ]
    assert stale.error == "NVML: the GPU is lost"
    assert resized == [Limits(limit=5), Limits(limit=1), Limits(limit=5)]


class HeldLaw(QuietLaw):
    """An SLO law at the plan's permits, holding ``held[0]`` when the plan goes stale."""

    def __init__(self, held: list[int | None]) -> None:
        self.held = held

    def step(self, plan: Plan) -> Limits:
        return Limits(limit=plan.permits, in_flight=plan.permits)

    def hold_limit(self) -> int | None:
        return self.held[0]


async def test_a_held_limit_stands_on_the_floor() -> None:
    """slo admission holds its law's limit (steered by the streams, not the plan) when the
    engine's /metrics go silent: the floor never starves an engine that still streams."""
    gpu, clock, resized = ScriptedGpu(), Clock(), list[Limits]()
    held: list[int | None] = [12]
    loop = CapacityController(
        sources=Sources(requested="nvml", declared=TEXTBOOK, gpu_probe=gpu),
        planning=qwen(SloMode(HeldLaw(held))),
        sinks=Sinks(resize=resized.append),
        cadence=Cadence(stale_after_s=10.0, clock=clock),
    )
    await loop.refresh()
    gpu.failure = ProbeTemporaryError("the engine's /metrics timed out")
    clock.now += 11
    floored = await loop.refresh()
    held[0] = None  # the engine was not seen to preempt: the floor's own limit
    clock.now += 1
    bare = await loop.refresh()
    assert [(s.mode, s.limit) for s in (floored, bare)] == [("floor", 12), ("floor", 1)]
    # The cap in flight stays where the last plan left it.
    assert resized == [Limits(limit=n, in_flight=5) for n in (5, 12, 1)]


async def test_each_transition_is_logged_once_not_every_tick() -> None:
    """Three failing ticks log one stale and one floor event, and recovery one fresh event."""
    gpu, clock = ScriptedGpu(), Clock()
    loop = controller(gpu, clock, [])
    await loop.refresh()
    gpu.failure = ProbeTemporaryError("gone")
    with capture_logs() as logs:
        for _ in range(3):
            clock.now += 4
            await loop.refresh()
        await loop.refresh()
        gpu.failure = None
        await loop.refresh()
        await loop.refresh()
    assert [e["event"] for e in logs] == ["capacity_stale", "capacity_on_floor", "capacity_fresh"]


async def test_no_good_plan_yet_means_the_floor() -> None:
    """Failing from the very first tick puts the floor in force at once."""
    gpu = ScriptedGpu()
    gpu.failure = ProbeTemporaryError("no driver")
    state = await controller(gpu, Clock(), []).refresh()
    assert (state.on_floor, state.limit, state.plan) == (True, 1, None)


async def test_plan_age_grows_with_the_clock() -> None:
    """The age reported is the time since the last good plan, from the injected clock."""
    gpu, clock = ScriptedGpu(), Clock()
    loop = controller(gpu, clock, [])
    await loop.refresh()
    gpu.failure = ProbeTemporaryError("gone")
    clock.now += 3
    await loop.refresh()
    assert loop.state.age_s(clock.now + 1) == pytest.approx(4.0)


async def test_loop_survives_a_crashing_tick_and_stops_cleanly() -> None:
    """A bug in one tick degrades the plan (logged once); the named task runs until stop()."""
    gpu, ticks, third = ScriptedGpu(), [], asyncio.Event()

    class Exploding(ScriptedGpu):
        async def read(self) -> GpuSnapshot:
            ticks.append(1)
            if len(ticks) == 3:
                third.set()
            if len(ticks) == 1:
                raise RuntimeError("bug")
            return await gpu.read()

    async def no_wait(_s: float) -> None:
        await asyncio.sleep(0)

    loop = controller(Exploding(), Clock(), [], sleep=no_wait)
    with capture_logs() as logs:
        loop.start()
        names = {t.get_name() for t in asyncio.all_tasks()}
        await asyncio.wait_for(third.wait(), timeout=5)
        await asyncio.sleep(0)  # let the third tick publish
        await loop.stop()
    assert TASK_NAME in names
    assert logs[0]["event"] == "capacity_on_floor"
    assert "RuntimeError('bug')" in logs[0]["error"]
    assert loop.state.limit == 5
    assert TASK_NAME not in {t.get_name() for t in asyncio.all_tasks()}


def settings(**extra: str) -> dict[str, str]:
    base = {"SIDECAR_MODEL": "qwen2.5-7b", "SIDECAR_VRAM_TOTAL": "8GiB", "SIDECAR_WEIGHTS": "5GiB"}
    return base | {"SIDECAR_OVERHEAD": "1.5GiB", "SIDECAR_ENGINE_MEMORY_FRACTION": "1"} | extra


@pytest.mark.parametrize(
    ("extra", "limit"),
    [
        pytest.param({}, 5, id="count-mode-permits"),
        pytest.param({"SIDECAR_MAX_CONCURRENT_CALLS": "3"}, 3, id="count-mode-capped"),
        pytest.param({"SIDECAR_ADMISSION": "tokens"}, 1_288_490_188, id="token-mode-bytes"),
    ],
)
async def test_build_controller_hands_the_bulkhead_the_right_limit(
    extra: dict[str, str], limit: int
) -> None:
    """Count mode gets permits (capped), token mode gets alpha x pool in bytes."""
    resized: list[Limits] = []
    env = settings(SIDECAR_CAPACITY_SOURCE="static", **extra)
    loop = build_controller(load_settings(env), resized.append, clock=Clock())
    await loop.refresh()
    assert resized == [Limits(limit=limit)]


async def test_floor_defaults_to_the_declared_static_plan() -> None:
    """With declared numbers, losing every probe falls back to their plan, not to one permit."""
    gpu = ScriptedGpu()
    gpu.failure = ProbeTemporaryError("no GPU")
    env = settings(SIDECAR_CAPACITY_SOURCE="nvml", SIDECAR_ENGINE_METRICS_URL="http://127.0.0.1:9/")
    loop = build_controller(load_settings(env), lambda _n: None, clock=Clock(), nvml=gpu)
    state = await loop.refresh()
    await loop.stop()
    assert (state.on_floor, state.limit, gpu.closed) == (True, 5, True)


async def test_capacity_json_and_metrics_show_terms_and_gpu_memory() -> None:
    """/capacity names each term's source and age; /metrics shows GPU memory and staleness."""
    clock = Clock()
    loop = controller(ScriptedGpu(GIB // 2), clock, [])
    await loop.refresh()
    registry = CollectorRegistry()
    register_capacity_metrics(registry, loop, clock)
    doc = capacity_json(loop.state, loop.requested_source, clock.now + 2)
    text = generate_latest(registry).decode()
    terms = {t["name"]: (t["source"], t["age_s"]) for t in doc["plan"]["terms"]}
    assert terms["neighbours"] == ("measured", 102.0)
    assert terms["weights"] == ("declared", 102.0)
    assert doc["gpus"][0]["processes"][1] == {"pid": 2, "used_bytes": GIB // 2}
    assert 'sidecar_gpu_memory_total_bytes{gpu="GPU-0"} 8.589934592e+09' in text
    assert "sidecar_capacity_stale 0.0" in text
    assert "sidecar_kv_pool_bytes 1.610612736e+09" in text  # the neighbour is not subtracted
    assert 'sidecar_engine_headroom_bytes{gpu="GPU-0"} -536870912.0' in text
    assert doc["headroom"][0]["taken_bytes"] == GIB // 2


class ScriptedEngine:
    """An engine probe reporting vLLM's cache_config_info with a given block size."""

    def __init__(self, block_size: int | None) -> None:
        self.block_size = block_size

    async def read(self) -> EngineReading:
        cache = EngineCacheConfig(
            num_gpu_blocks=8192,
            block_size=self.block_size,
            kv_cache_size_tokens=1_048_576,
            kv_cache_memory_bytes=GIB,
            cache_dtype="auto",
            gpu_memory_utilization=0.9,
        )
        return EngineReading(
            cache=cache,
            kv_usage_ratio=0.0,
            requests_running=0.0,
            requests_waiting=0.0,
            preemptions_total=0.0,
            observed_at=0.0,
        )

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("declared_block", "engine_block", "permits"),
    [
        pytest.param(None, 128, 4096, id="engine-block-rounds-129-up-to-256-tokens"),
        pytest.param(None, None, 8128, id="no-block-anywhere-no-rounding"),
        pytest.param(64, 128, 5461, id="declared-block-wins-192-tokens"),
    ],
)
async def test_requests_are_rounded_to_the_engines_blocks(
    declared_block: int | None, engine_block: int | None, permits: int
) -> None:
    """Without SIDECAR_BLOCK_SIZE the engine's own block size rounds each request up."""
    tiny = KvCost(spec=load_model_spec("tests/configs/tiny-llama.json"), block_size=declared_block)
    loop = CapacityController(
        sources=Sources(
            requested="vllm", declared=NOTHING_DECLARED, engine_probe=ScriptedEngine(engine_block)
        ),
        planning=Planning(
            cost=tiny,
            budget=Budget(100, 29),  # 129 tokens of 1,024 B
            alpha=1.0,
            mode=CountMode(),
            floor=Floor(None, 1),
        ),
        sinks=Sinks(resize=lambda _: None),
        cadence=Cadence(clock=Clock()),
    )
    state = await loop.refresh()
    assert state.limit == permits
    assert loop.cost.block_size == (declared_block or engine_block)


async def test_engine_process_unseen_warns_and_keeps_the_pod_ready() -> None:
    """The engine answers, NVML lists no process for it: the plan stands on the engine's own
    pool, one engine_process_unseen warning says what happened, readiness is not touched."""
    tiny = KvCost(spec=load_model_spec("tests/configs/tiny-llama.json"))
    gpu = ScriptedGpu()

    class Unlisted(ScriptedGpu):
        async def read(self) -> GpuSnapshot:
            snap = await gpu.read()
            return GpuSnapshot((replace(snap.gpus[0], processes=()),), observed_at=0.0)

    loop = CapacityController(
        sources=Sources(
            requested="vllm",
            declared=declared(weights_bytes=4 * GIB),
            gpu_probe=Unlisted(),
            engine_probe=ScriptedEngine(None),
        ),
        planning=Planning(
            cost=tiny, budget=Budget(100, 29), alpha=1.0, mode=CountMode(), floor=Floor(None, 1)
        ),
        sinks=Sinks(resize=lambda _: None),
        cadence=Cadence(clock=Clock()),
    )
    state = await loop.refresh()
    assert (state.mode, state.limit, state.disagreements) == ("fresh", 8128, ())
    assert [w.code for w in state.warnings] == ["engine_process_unseen"]
    assert loop.engine_unready() is None


class CountedGpu(ScriptedGpu):
    """Counts its reads: one a tick."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read(self) -> GpuSnapshot:
        self.reads += 1
        return await super().read()


async def periods_never_end(seconds: float) -> None:
    """The loop's sleep: the least gap between ticks passes at once, the rest of a period never
    does, so every tick after the first gap is one that ``hurry`` brought."""
    if seconds > HURRY_GAP_S:
        await asyncio.Event().wait()
    await asyncio.sleep(0)


async def settle() -> None:
    """Let every task run until all of them wait (a tick takes a few dozen loop turns)."""
    for _ in range(500):
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("keep_hurrying", "ticks"),
    [
        pytest.param(0, 1, id="one-hurry-one-tick"),
        pytest.param(3, 4, id="queue-still-waiting-three-more-ticks"),
    ],
)
async def test_a_hurry_ticks_now_instead_of_a_period_later(keep_hurrying: int, ticks: int) -> None:
    """Without a hurry no tick comes before the period ends; ``hurry()`` brings one at once,
    and as long as ``hurry_while`` says so after a tick, the next one comes at once too."""
    gpu, asked = CountedGpu(), []

    def hurry_while() -> bool:
        asked.append(1)
        return len(asked) <= keep_hurrying

    loop = controller(gpu, Clock(), [], sleep=periods_never_end, hurry_while=hurry_while)
    loop.start()
    await settle()
    assert gpu.reads == 0
    loop.hurry()
    await settle()
    assert gpu.reads == ticks
    await loop.stop()
