"""The capacity loop supervises itself: staleness judged when read, probe timeouts, any exception
degrades, a watchdog applies the floor, a stuck NVML call never blocks stop()."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest
from structlog.testing import capture_logs

from sidecar.core.limits import Limits
from sidecar.live.probes import GpuSnapshot
from sidecar.live.probes.nvml_worker import NvmlWorker
from tests.test_control_loop import Clock, ScriptedGpu, controller


class HangingGpu(ScriptedGpu):
    """Reads normally until ``hang`` is set, then never returns."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = False

    async def read(self) -> GpuSnapshot:
        if self.hang:
            await asyncio.Event().wait()
        return await super().read()


class BuggyGpu(ScriptedGpu):
    """A probe whose read raises something that is not a ProbeError."""

    async def read(self) -> GpuSnapshot:
        raise OverflowError("cannot convert float infinity to integer")


async def test_a_plan_not_renewed_reads_stale_then_floor_without_another_tick() -> None:
    """Nothing ticks: the state read later is stale past the fresh window, then the floor."""
    clock = Clock()
    loop = controller(ScriptedGpu(), clock, [])
    await loop.refresh()
    assert (loop.state.mode, loop.state.limit) == ("fresh", 5)
    clock.now += loop.fresh_for_s + 0.1
    assert (loop.state.mode, loop.state.limit) == ("stale", 5)
    clock.now += 10
    assert (loop.state.mode, loop.state.limit) == ("floor", 1)
    assert "no new plan" in (loop.state.error or "")


async def test_the_watchdog_hands_the_bulkhead_the_floor() -> None:
    """enforce() (the watchdog's step) resizes to the floor once the plan is too old."""
    clock, resized = Clock(), list[Limits]()
    loop = controller(ScriptedGpu(), clock, resized)
    await loop.refresh()
    clock.now += 60
    with capture_logs() as logs:
        assert loop.enforce().mode == "floor"
    assert resized == [Limits(limit=5), Limits(limit=1)]
    assert [e["event"] for e in logs] == ["capacity_on_floor"]


async def test_a_hung_probe_read_times_out_and_degrades() -> None:
    """A read that never returns is abandoned after the probe timeout; the tick degrades."""
    gpu, clock = HangingGpu(), Clock()
    loop = controller(gpu, clock, [], probe_timeout_s=0.05)
    await loop.refresh()
    gpu.hang = True
    state = await asyncio.wait_for(loop.refresh(), 2)
    assert state.mode == "stale"
    assert "timed out" in (state.error or "")


async def test_any_exception_in_a_probe_degrades_instead_of_staying_fresh() -> None:
    """An OverflowError from a probe (an 'inf' in the engine's metrics) is a failed read."""
    loop = controller(BuggyGpu(), Clock(), [])
    state = await loop.refresh()
    assert state.mode == "floor"
    assert "OverflowError" in (state.error or "")


async def test_a_stuck_nvml_call_does_not_hold_up_its_worker_callers() -> None:
    """The worker's caller can give up on a stuck call; stop() returns at once."""
    worker, release = NvmlWorker(), threading.Event()
    stuck = worker.run(release.wait)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(stuck), 0.05)
    worker.stop()  # never waits for the stuck call
    assert not stuck.done()
    release.set()
    assert await asyncio.wait_for(stuck, 2) is True


async def test_worker_calls_run_in_order_and_carry_their_errors() -> None:
    """Results and exceptions come back to the awaiting coroutine."""
    worker = NvmlWorker()
    assert await worker.run(lambda: 41 + 1) == 42
    with pytest.raises(ZeroDivisionError):
        await worker.run(lambda: 1 // 0)
    worker.stop()
