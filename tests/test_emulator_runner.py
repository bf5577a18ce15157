"""The emulated engine's async shell: engine time per step, preemption's cost, aborts and OOM."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest
from prometheus_client import generate_latest

from emulator.config import EmulatorConfig
from emulator.kv_pool import KVPool
from emulator.metrics import build_registry
from emulator.runner import ClientGoneError, EngineRunner, KVCacheExhaustedError, Pacing, StepCost
from sidecar.live.probes.engine import parse_metrics


class EngineClock:
    """A fake clock that the runner's sleeps move: engine time without real time passing.

    A sleep lets the loop run a few rounds, so consumers woken by the last step read their
    token before the clock moves on (as they would while a real engine computes).
    """

    def __init__(self) -> None:
        self.now = 0.0
        self.delays: list[float] = []

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        for _ in range(4):
            await asyncio.sleep(0)
        self.now += delay


def always() -> bool:
    return True


def make_runner(
    *,
    num_blocks: int = 8,
    block_size: int = 2,
    max_num_seqs: int = 4,
    oom: bool = False,
    cost: StepCost | None = None,
) -> tuple[EngineRunner, EngineClock]:
    clock = EngineClock()
    pool = KVPool(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs, oom=oom)
    runner = EngineRunner(pool, cost=cost or StepCost(), sleep=clock.sleep, poll_s=0.01)
    return runner, clock


async def token_times(
    runner: EngineRunner, clock: EngineClock, request_id: str, prompt: int, length: int
) -> list[float]:
    """The engine-clock time at which each of the request's tokens reached its consumer."""
    return [clock.now async for _ in runner.generate(request_id, prompt, length, Pacing(), always)]


async def test_generates_max_tokens_and_frees_the_blocks() -> None:
    """A request yields exactly max_tokens tokens and leaves the pool empty, counted as length."""
    runner, _ = make_runner()
    out = [i async for i in runner.generate("a", 3, 5, Pacing(), always)]
    assert out == [0, 1, 2, 3, 4]
    snap = runner.pool.snapshot()
    assert (snap.used_blocks, snap.running, snap.finished["length"]) == (0, 0, 1)
    await runner.close()


async def test_a_step_takes_its_fixed_time_plus_its_tokens() -> None:
    """The prefill step of a 10-token prompt costs 10 tokens of compute; each decode step one."""
    runner, clock = make_runner(num_blocks=16, cost=StepCost(step_s=0.02, token_s=0.001))
    times = await token_times(runner, clock, "a", 10, 3)
    assert clock.delays == pytest.approx([0.02 + 0.010, 0.02 + 0.001, 0.02 + 0.001])
    assert times == pytest.approx([0.030, 0.051, 0.072])
    assert runner.engine_s == pytest.approx(0.072)


async def test_finished_requests_count_the_time_they_ran_as_vllm_does() -> None:
    """vLLM's request_inference_time_seconds: a request runs from the step of its first token
    to the step of its last. Two of 3 tokens side by side: a step of both prompts (0.02 + 10 x
    0.001 s), then two decode steps of both (0.02 + 2 x 0.001 s): each ran 0.074 s."""
    runner, clock = make_runner(num_blocks=16, cost=StepCost(step_s=0.02, token_s=0.001))
    await asyncio.gather(
        token_times(runner, clock, "a", 5, 3), token_times(runner, clock, "b", 5, 3)
    )
    snap = runner.snapshot()
    assert snap.finished["length"] == 2
    assert snap.finished_inference_s == pytest.approx(2 * (0.030 + 0.022 + 0.022))
    await runner.close()


async def test_first_token_delay_comes_before_the_queue() -> None:
    """A slow-first-token delay passes before the request reaches the engine."""
    runner, clock = make_runner(cost=StepCost(step_s=0.025))
    assert [i async for i in runner.generate("a", 1, 2, Pacing(0.5), always)] == [0, 1]
    assert clock.delays == [0.5, 0.025, 0.025]


async def test_long_prompt_slows_the_stream_running_beside_it() -> None:
    """A new prompt prefilled in the same step delays the running stream's next token."""
    cost = StepCost(step_s=0.01, token_s=0.001)
    runner, clock = make_runner(num_blocks=64, cost=cost)
    running = runner.generate("a", 2, 6, Pacing(), always)
    times = [clock.now for _ in [await anext(running)]]
    newcomer = asyncio.create_task(token_times(runner, clock, "b", 50, 1))
    times += [clock.now async for _ in running]
    await newcomer
    gaps = [round(later - earlier, 6) for earlier, later in itertools.pairwise(times)]
    assert max(gaps) == pytest.approx(0.01 + 0.001 * (50 + 1))  # b's prompt, a's decode
    assert min(gaps) == pytest.approx(0.01 + 0.001)


async def preempted_run(num_blocks: int) -> tuple[list[float], EngineRunner]:
    """old (4 tokens, 12 to generate), short (4, 2) and new (8, 12) with 4-token blocks."""
    runner, clock = make_runner(
        num_blocks=num_blocks, block_size=4, cost=StepCost(step_s=0.01, token_s=0.001)
    )
    old = asyncio.create_task(token_times(runner, clock, "old", 4, 12))
    short = asyncio.create_task(token_times(runner, clock, "short", 4, 2))
    new = asyncio.create_task(token_times(runner, clock, "new", 8, 12))
    old_times, *_ = await asyncio.gather(old, short, new)
    return old_times, runner


async def test_preempted_request_recompute_takes_engine_time_from_the_others() -> None:
    """With 6 blocks `new` is preempted (twice); resumed, it prefills its 8 prompt tokens and its
    generated one again in old's step, so old's stream and the whole run take longer than with
    room to spare."""
    crowded, crowded_runner = await preempted_run(num_blocks=6)
    roomy, roomy_runner = await preempted_run(num_blocks=64)
    crowded_snap = crowded_runner.pool.snapshot()
    assert (crowded_snap.preemptions, crowded_snap.recomputed_tokens) == (2, 9 + 13)
    assert roomy_runner.pool.snapshot().preemptions == 0
    gaps = [later - earlier for earlier, later in itertools.pairwise(crowded)]
    assert max(gaps) == pytest.approx(0.01 + 0.001 * (9 + 1))  # the recompute, old's decode
    assert crowded[-1] > roomy[-1]
    assert crowded_runner.engine_s > roomy_runner.engine_s


async def test_queued_request_starts_when_the_running_one_leaves() -> None:
    """With max_num_seqs=1 a second request waits (TTFT grows) until the first one is gone."""
    runner, _ = make_runner(max_num_seqs=1)
    first = runner.generate("a", 1, 5, Pacing(hang_after=1), always)
    second = runner.generate("b", 1, 2, Pacing(), always)
    assert await anext(first) == 0
    waiting = asyncio.create_task(anext(second))
    await asyncio.sleep(0.03)
    assert not waiting.done()
    assert runner.pool.snapshot().waiting == 1
    await first.aclose()
    assert await asyncio.wait_for(waiting, 1) == 0
    await second.aclose()
    await runner.close()


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
    await runner.close()


async def test_client_gone_while_queued_is_noticed_and_aborted() -> None:
    """A waiting request whose client disconnects leaves the queue without a write to fail."""
    runner, _ = make_runner(max_num_seqs=1)
    holder = runner.generate("a", 1, 10, Pacing(hang_after=1), always)
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
    await runner.close()


async def test_oom_mode_fails_streams_when_kv_runs_out() -> None:
    """In oom mode every running stream raises KVCacheExhaustedError when a block is missing."""
    runner, _ = make_runner(num_blocks=3, oom=True)
    first = runner.generate("a", 2, 10, Pacing(), always)
    assert await anext(first) == 0  # a holds 1 of the 3 blocks
    second = runner.generate("b", 3, 10, Pacing(), always)
    with pytest.raises(KVCacheExhaustedError):
        async for _ in second:
            pass
    with pytest.raises(KVCacheExhaustedError):
        async for _ in first:
            pass
    assert runner.pool.snapshot().used_blocks == 0
    await runner.close()


async def test_the_time_requests_ran_has_vllms_buckets() -> None:
    """The emulator counts each finished request's running time into vLLM's own buckets, so
    the probe reads how those times are spread, as from vLLM: two requests of 0.074 s each lie
    in the first bucket (0-0.3 s)."""
    runner, clock = make_runner(num_blocks=16, cost=StepCost(step_s=0.02, token_s=0.001))
    await asyncio.gather(
        token_times(runner, clock, "a", 5, 3), token_times(runner, clock, "b", 5, 3)
    )
    config = EmulatorConfig(max_model_len=64, kv_tokens=256, block_size=16)
    text = generate_latest(build_registry(config, runner.snapshot)).decode()
    spread = parse_metrics(text, 0.0).inference_quantiles_s
    assert len(spread) == 16
    assert all(0.0 < q <= 0.3 for q in spread)
    await runner.close()
