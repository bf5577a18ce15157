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


@dataclass(slots=True)
class Stop:
    """Set when the sidecar itself ends this request; ``reason`` is an outcome code."""

    reason: str | None = None

    def claim(self) -> bool:
        """In an ``except CancelledError``: True (and the cancel absorbed) if it was our stop."""
        task = asyncio.current_task()
        if self.reason is None or task is None:
            return False
        task.uncancel()
        return True


class InFlight:
    """The tasks of requests that hold a permit."""

    def __init__(self) -> None:
        self._tasks: dict[asyncio.Task[object], Stop] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    @contextmanager
    def track(self) -> Iterator[Stop]:
        task = asyncio.current_task()
        stop = Stop()
        if task is not None:
            self._tasks[task] = stop
        try:
            yield stop
        finally:
            if task is not None:
                self._tasks.pop(task, None)

    def stop_all(self, reason: str) -> int:
        """Cancel every tracked request with ``reason``; how many there were."""
        stopped = 0
        for task, stop in list(self._tasks.items()):
            if stop.reason is None and not task.done():
                stop.reason = reason
                task.cancel()
                stopped += 1
        return stopped
