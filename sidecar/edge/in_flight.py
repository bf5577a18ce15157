"""Every request past admission, so a drain whose grace ran out can end them, whatever clients do.

``track()`` registers the handler's task; ``stop_all(reason)`` cancels each one with the reason
noted on its :class:`Stop`, so the handler can tell our stop from a client hanging up and end
the answer in-band (an SSE error event, or a 503) instead of unwinding silently.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Stop:
    """One tracked request, for the body of ``with in_flight.track() as stop``; ``reason`` is set
    (an outcome code) when the sidecar itself ends the request.
    """

    __slots__ = ("_task", "_tasks", "reason")

    def __init__(
        self, tasks: dict[asyncio.Task[object], Stop], task: asyncio.Task[Any] | None
    ) -> None:
        self._tasks = tasks
        self._task: asyncio.Task[object] | None = task
        self.reason: str | None = None

    def __enter__(self) -> Stop:
        if self._task is None:  # on 3.11, current_task() costs a getpid syscall
            self._task = asyncio.current_task()
        if self._task is not None:
            self._tasks[self._task] = self
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._task is not None:
            self._tasks.pop(self._task, None)

    def claim(self) -> bool:
        """In an ``except CancelledError``: True (and the cancel absorbed) if it was our stop."""
        if self.reason is None or self._task is None:
            return False
        self._task.uncancel()  # the tracked task is the one handling the cancel
        return True


class InFlight:
    """The tasks of requests that hold a permit."""

    def __init__(self) -> None:
        self._tasks: dict[asyncio.Task[object], Stop] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def track(self, task: asyncio.Task[Any] | None = None) -> Stop:
        """``with in_flight.track() as stop``: ``task`` (the handler's; by default the current
        one), stoppable, for the block."""
        return Stop(self._tasks, task)

    def stop_all(self, reason: str) -> int:
        """Cancel every tracked request with ``reason``; how many there were."""
        stopped = 0
        for task, stop in list(self._tasks.items()):
            if stop.reason is None and not task.done():
                stop.reason = reason
                task.cancel()
                stopped += 1
        return stopped
