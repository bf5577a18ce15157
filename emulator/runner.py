"""The async shell around the KV pool: one engine loop steps it, each step takes engine time.

Prefill and decode share the engine's steps, as in vLLM: a step's time is a fixed part (the
decode of every running stream) plus a part per token it computes, so a long prompt, or a
preempted request prefilled again, slows every running stream in that step.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field, replace

from emulator.kv_pool import INFERENCE_BUCKETS_S, KVPool, Snapshot, Step

Sleep = Callable[[float], Awaitable[None]]
Alive = Callable[[], bool]


class KVCacheExhaustedError(RuntimeError):
    """oom mode: the pool ran out while the request was generating; the engine failed it."""


class ClientGoneError(ConnectionError):
    """The client disconnected while the request waited; it was aborted."""


@dataclass(frozen=True)
class Pacing:
    """Faults of one request: a delay before it reaches the engine's queue, a hang after N."""

    first_token_delay_s: float = 0.0
    hang_after: int | None = None  # the engine stops stepping it after this many tokens


@dataclass(frozen=True)
class StepCost:
    """Engine time of one step: ``step_s`` plus ``token_s`` per token computed in it.

    Decode tokens count too (one per running stream), so a full batch is slower than a lone one.
    """

    step_s: float = 0.0
    token_s: float = 0.0

    def seconds(self, step: Step) -> float:
        """How long the engine takes to compute ``step``."""
        return self.step_s + self.token_s * step.scheduled_tokens


@dataclass
class _Stream:
    produced: int = 0
    killed: bool = False
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class EngineRunner:
    """Drives requests through a ``KVPool`` with one engine loop; one runner per engine."""

    def __init__(
        self,
        pool: KVPool,
        *,
        cost: StepCost = StepCost(),
        sleep: Sleep = asyncio.sleep,
        poll_s: float = 0.05,
    ) -> None:
        self.pool = pool
        self._cost = cost
        self._sleep = sleep
        # A request has no write to fail on while it waits, so it polls for its client leaving.
        self._poll_s = poll_s
        self._streams: dict[str, _Stream] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._work = asyncio.Event()
        self.engine_s = 0.0  # engine time spent in steps so far
        self._began: dict[str, float] = {}  # request -> engine time its first token's step began
        self._inference_s = 0.0  # engine time the finished requests ran, first step to last
        self._inference_counts = [0] * len(INFERENCE_BUCKETS_S)  # per bucket, not cumulative

    def snapshot(self) -> Snapshot:
        """The pool's snapshot, with the time its finished requests ran."""
        cumulative, total = [], 0
        for count in self._inference_counts:
            total += count
            cumulative.append(total)
        return replace(
            self.pool.snapshot(),
            finished_inference_s=self._inference_s,
            finished_inference_buckets=tuple(cumulative),
        )

    async def generate(
        self, request_id: str, prompt_tokens: int, max_tokens: int, pacing: Pacing, alive: Alive
    ) -> AsyncGenerator[int, None]:
        """Yield token indices 0..max_tokens-1; the request's blocks are freed however it ends.

        Consume it inside ``contextlib.aclosing`` so an early exit aborts the request at once.
        """
        if pacing.first_token_delay_s > 0:
            await self._sleep(pacing.first_token_delay_s)
        stream = self._streams[request_id] = _Stream()
        self.pool.submit(request_id, prompt_tokens, max_tokens, hang_after=pacing.hang_after)
        self._kick()
        try:
            for index in range(max_tokens):
                while stream.produced <= index:
                    await self._next(request_id, stream, alive)
                yield index
        finally:
            del self._streams[request_id]
            self._began.pop(request_id, None)
            if self.pool.phase(request_id) is not None:  # gone early: free its blocks now
                self.pool.abort(request_id)
                self._kick()

    async def close(self) -> None:
        """Stop the engine loop (the app's cleanup)."""
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _next(self, request_id: str, stream: _Stream, alive: Alive) -> None:
        if stream.killed:
            raise KVCacheExhaustedError(request_id)
        if not alive():
            raise ClientGoneError(request_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stream.ready.wait(), self._poll_s)
        stream.ready.clear()

    def _kick(self) -> None:
        self._work.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(
                self._engine_loop(), name="emulator-engine-loop"
            )

    async def _engine_loop(self) -> None:
        """Step while there is work; a step that computes nothing waits for a submit or abort."""
        while self.pool.has_work:
            self._work.clear()
            step = self.pool.step()
            if not step.scheduled_tokens and not step.killed:
                await self._work.wait()
                continue
            seconds = self._cost.seconds(step)
            began = self.engine_s
            self.engine_s += seconds
            await self._sleep(seconds)
            self._time(step, began)
            self._deliver(step)

    def _time(self, step: Step, began: float) -> None:
        """A request runs from the step that computed its first token (its prefill's last, for
        a prompt chunked over several) to the one that computed its last."""
        for request_id in step.tokens:
            self._began.setdefault(request_id, began)
        for request_id in step.preempted:
            self._began.pop(request_id, None)  # prefilled again: it runs from then
        for request_id in step.finished:
            ran = self.engine_s - self._began.pop(request_id, began)
            self._inference_s += ran
            bucket = bisect.bisect_left(INFERENCE_BUCKETS_S, ran)
            if bucket < len(self._inference_counts):
                self._inference_counts[bucket] += 1

    def _deliver(self, step: Step) -> None:
        for request_id in step.tokens:
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.produced += 1
                stream.ready.set()
        for request_id in step.killed:
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.killed = True
                stream.ready.set()
