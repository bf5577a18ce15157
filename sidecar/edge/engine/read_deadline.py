"""The engine connection's read deadline: no byte from the engine for ``timeout_s`` while a
reader waits is a timeout. One timer per connection, re-armed from the last byte's time when it
fires early, so a byte that arrives costs a clock read, not a new timer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Handle(Protocol):
    """What ``call_later`` returns (asyncio's TimerHandle)."""

    def cancel(self) -> None: ...


class ReadDeadline:
    """``expired`` is called once ``timeout_s`` passed since the last ``touch`` while the
    timer runs; it runs from ``watch`` (a reader starts waiting) until it expires or ``stop``."""

    def __init__(
        self,
        timeout_s: float,
        expired: Callable[[], None],
        *,
        clock: Callable[[], float],
        call_later: Callable[[float, Callable[[], None]], Handle],
    ) -> None:
        self.timeout_s, self._expired = timeout_s, expired
        self._clock, self._call_later = clock, call_later
        self._timer: Handle | None = None
        self._last = 0.0

    def touch(self) -> None:
        """A byte came, or a request went out: the deadline counts from now."""
        self._last = self._clock()

    def watch(self) -> None:
        """A reader waits: the deadline runs (a timer left running keeps its last ``touch``)."""
        if self._timer is None:
            self.touch()
            self._timer = self._call_later(self.timeout_s, self._fire)

    def resume(self, heard_ago_s: float) -> None:
        """After it expired: the engine was heard from elsewhere ``heard_ago_s`` ago (its
        metrics answered), so the silence counts from then; the timer runs again."""
        self._last = self._clock() - heard_ago_s
        self._timer = self._call_later(max(0.0, self.timeout_s - heard_ago_s), self._fire)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        quiet = self._clock() - self._last
        if quiet < self.timeout_s:
            self._timer = self._call_later(self.timeout_s - quiet, self._fire)
        else:
            self._expired()
