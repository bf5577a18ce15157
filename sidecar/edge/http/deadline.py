"""The one deadline a client connection has at a time: for a request head, for the next request
on an idle kept-alive connection, or for reading off what a client still sends before the close."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

Due = Literal["head", "idle", "linger"]


class Deadline:
    """A timer for one :data:`Due` at a time; setting another replaces it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, expired: Callable[[Due], None]) -> None:
        self._loop, self._expired = loop, expired
        self._timer: asyncio.TimerHandle | None = None
        self.due: Due | None = None

    def set(self, due: Due, seconds: float) -> None:
        self.clear()
        self.due = due
        self._timer = self._loop.call_later(seconds, self._fire)

    def clear(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self.due = None, None

    def _fire(self) -> None:
        due, self._timer, self.due = self.due, None, None
        if due is not None:
            self._expired(due)
