"""Every request past admission, so a drain whose grace ran out can end them, whatever clients do.

``track()`` registers the handler's task; ``stop_all(reason)`` cancels each one with the reason
noted on its :class:`Stop`, so the handler can tell our stop from a client hanging up and end
the answer in-band (an SSE error event, or a 503) instead of unwinding silently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class Stop:
    """One tracked request; ``reason`` is set (an outcome code) when the sidecar itself ends it."""

    task: asyncio.Task[Any]
    reason: str | None = None

    def claim(self) -> bool:
        """In an ``except CancelledError``: True (and the cancel absorbed) if it was our stop."""
        if self.reason is None:
            return False
        self.task.uncancel()  # the tracked task is the one handling the cancel
        return True


class InFlight:
    """The tasks of requests that hold a permit."""

    def __init__(self) -> None:
        self._stops: dict[asyncio.Task[Any], Stop] = {}

    def __len__(self) -> int:
        return len(self._stops)

    @contextmanager
    def track(self) -> Iterator[Stop]:
        """``with in_flight.track() as stop``: the current task, stoppable, for the block."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("track() is for a coroutine running in a task")
        stop = self._stops[task] = Stop(task)
        try:
            yield stop
        finally:
            self._stops.pop(task, None)

    def stop_all(self, reason: str) -> int:
        """Cancel every tracked request with ``reason``; how many there were."""
        stopped = 0
        for task, stop in list(self._stops.items()):
            if stop.reason is None and not task.done():
                stop.reason = reason
                task.cancel()
                stopped += 1
        return stopped
