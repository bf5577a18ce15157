"""One daemon thread that runs NVML calls in order, off the event loop.

Not the loop's default executor: a hung NVML call must not starve other threads' work, and a
daemon thread never holds up the process's exit (an executor's threads are joined at exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class NvmlWorker:
    """Runs blocking calls one at a time on its own daemon thread."""

    def __init__(self, name: str = "nvml") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, call: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``call``; the future settles on the caller's loop when it returns or raises."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((call, loop, future))
        return future

    def stop(self) -> None:
        """Let the thread end after the call in hand (if any); never waits for it."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            call, loop, future = job
            try:
                result = call()
            except Exception as exc:  # handed to the awaiting coroutine, raised there
                _settle(loop, future, None, exc)
            else:
                _settle(loop, future, result, None)


def _settle(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    def deliver() -> None:
        if future.done():  # the caller gave up on it (timed out, cancelled)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the loop closed while the call ran
        loop.call_soon_threadsafe(deliver)
