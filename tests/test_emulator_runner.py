"""The emulated engine's async shell: queue waits, pacing, aborts and OOM, with a fake sleep."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from emulator.kv_pool import KVPool
from emulator.runner import ClientGoneError, EngineRunner, KVCacheExhaustedError, Pacing


class RecordingSleep:
    """Records requested delays and only yields to the loop: no real time passes."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


def always() -> bool:
    return True


def make_runner(
    *, num_blocks: int = 8, max_num_seqs: int = 4, oom: bool = False
) -> tuple[EngineRunner, RecordingSleep]:
    sleep = RecordingSleep()
    pool = KVPool(num_blocks=num_blocks, block_size=2, max_num_seqs=max_num_seqs, oom=oom)
    return EngineRunner(pool, sleep=sleep, poll_s=0.01), sleep


async def test_generates_max_tokens_and_frees_the_blocks() -> None:
    """A request yields exactly max_tokens tokens and leaves the pool empty, counted as length."""
    runner, _ = make_runner()
    out = [i async for i in runner.generate("a", 3, 5, Pacing(), always)]
    assert out == [0, 1, 2, 3, 4]
    snap = runner.pool.snapshot()
    assert (snap.used_blocks, snap.running, snap.finished["length"]) == (0, 0, 1)


async def test_pacing_sleeps_for_ttft_then_per_token() -> None:
    """The first token waits the TTFT delay, each later one the token interval."""
    runner, sleep = make_runner()
    pacing = Pacing(first_token_delay_s=0.5, token_interval_s=0.025)
    assert [i async for i in runner.generate("a", 1, 3, pacing, always)] == [0, 1, 2]
    assert sleep.delays == [0.5, 0.025, 0.025, 0.025]


async def test_queued_request_starts_when_the_running_one_finishes() -> None:
    """With max_num_seqs=1 a second request waits (TTFT grows) until the first ends."""
    runner, _ = make_runner(max_num_seqs=1)
    first = runner.generate("a", 1, 2, Pacing(), always)
    second = runner.generate("b", 1, 2, Pacing(), always)
    assert await anext(first) == 0
    waiting = asyncio.create_task(anext(second))
    await asyncio.sleep(0.03)
    assert not waiting.done()
    assert runner.pool.snapshot().waiting == 1
    assert [i async for i in first] == [1]
    assert await asyncio.wait_for(waiting, 1) == 0
    await second.aclose()


async def test_closing_the_stream_early_aborts_and_frees_at_once() -> None:
    """Leaving the loop early (client gone) frees the request's blocks immediately."""
    runner, _ = make_runner()
    tokens = runner.generate("a", 3, 100, Pacing(), always)
    async with contextlib.aclosing(tokens):
        async for index in tokens:
            if index == 2:
                break
    snap = runner.pool.snapshot()
    assert (snap.used_blocks, snap.running, sum(snap.finished.values())) == (0, 0, 0)


async def test_client_gone_while_queued_is_noticed_and_aborted() -> None:
    """A waiting request whose client disconnects leaves the queue without a write to fail."""
    runner, _ = make_runner(max_num_seqs=1)
    holder = runner.generate("a", 1, 10, Pacing(), always)
    await anext(holder)
    gone = asyncio.Event()
    queued = runner.generate("b", 1, 10, Pacing(), lambda: not gone.is_set())
    waiting = asyncio.create_task(anext(queued))
    await asyncio.sleep(0.02)
    gone.set()
    with pytest.raises(ClientGoneError):
        await asyncio.wait_for(waiting, 1)
    assert runner.pool.snapshot().waiting == 0
    await holder.aclose()


async def test_oom_mode_fails_streams_when_kv_runs_out() -> None:
    """In oom mode a stream that needs a block the pool lacks raises KVCacheExhaustedError."""
    runner, _ = make_runner(num_blocks=3, oom=True)
    other = runner.generate("a", 2, 10, Pacing(), always)
    assert await anext(other) == 0  # a now holds 2 of the 3 blocks
    victim = runner.generate("b", 1, 10, Pacing(), always)
    with pytest.raises(KVCacheExhaustedError):
        async for _ in victim:
            pass
    with pytest.raises(KVCacheExhaustedError):
        await anext(other)
    assert runner.pool.snapshot().used_blocks == 0
