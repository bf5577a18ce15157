"""The async shell around the KV pool: waits for scheduling, paces tokens, frees on exit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from emulator.kv_pool import KVPool, Outcome

Sleep = Callable[[float], Awaitable[None]]
Alive = Callable[[], bool]


class KVCacheExhaustedError(RuntimeError):
    """oom mode: the pool ran out while the request was generating; the engine failed it."""


class ClientGoneError(ConnectionError):
    """The client disconnected while the request waited; it was aborted."""


@dataclass(frozen=True)
class Pacing:
    """How one request's tokens are spaced in time."""

    first_token_delay_s: float = 0.0
    token_interval_s: float = 0.0


class EngineRunner:
    """Drives requests through a ``KVPool``; one per emulated engine."""

    def __init__(self, pool: KVPool, *, sleep: Sleep = asyncio.sleep, poll_s: float = 0.05) -> None:
        self.pool = pool
        self._sleep = sleep
        # A waiting request has no write to fail on, so it polls for its client going away.
        self._poll_s = poll_s
        self._wakeups: dict[str, asyncio.Event] = {}

    async def generate(
        self, request_id: str, prompt_tokens: int, max_tokens: int, pacing: Pacing, alive: Alive
    ) -> AsyncGenerator[int, None]:
        """Yield token indices 0..max_tokens-1; the request's blocks are freed however it ends.

        Consume it inside ``contextlib.aclosing`` so an early exit aborts the request at once.
        """
        finished = False
        self._wake(self.pool.submit(request_id, prompt_tokens))
        try:
            await self._until_running(request_id, alive)
            await self._sleep(pacing.first_token_delay_s)
            index = 0
            while index < max_tokens:
                if not alive():
                    raise ClientGoneError(request_id)
                outcome = self.pool.advance(request_id)
                if outcome is Outcome.KILLED:
                    raise KVCacheExhaustedError(request_id)
                if outcome is Outcome.PREEMPTED:
                    await self._until_running(request_id, alive)
                    continue
                yield index
                index += 1
                await self._sleep(pacing.token_interval_s)
            self._wake(self.pool.finish(request_id, "length"))
            finished = True
        finally:
            self._wakeups.pop(request_id, None)
            if not finished:
                self._wake(self.pool.abort(request_id))

    async def _until_running(self, request_id: str, alive: Alive) -> None:
        while not self.pool.is_running(request_id):
            if self.pool.is_killed(request_id):
                raise KVCacheExhaustedError(request_id)
            if not alive():
                raise ClientGoneError(request_id)
            wakeup = self._wakeups.setdefault(request_id, asyncio.Event())
            try:
                await asyncio.wait_for(wakeup.wait(), self._poll_s)
            except TimeoutError:
                continue
            wakeup.clear()

    def _wake(self, request_ids: tuple[str, ...]) -> None:
        for request_id in request_ids:
            wakeup = self._wakeups.get(request_id)
            if wakeup is not None:
                wakeup.set()
