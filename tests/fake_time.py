"""A clock and timers the test moves by hand, for the bulkhead and its expiry timer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class FakeHandle:
    """What ``call_later`` returns: a timer that can be cancelled."""

    due: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class FakeTime:
    """Clock and timers moved by hand; ``honour_cancel=False`` models a timer already dispatched
    by the loop when the grant arrives (the race a real loop can produce)."""

    now: float = 0.0
    honour_cancel: bool = True
    timers: list[FakeHandle] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle(self.now + delay, callback)
        self.timers.append(handle)
        return handle

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [h for h in self.timers if h.due <= self.now]
        self.timers = [h for h in self.timers if h.due > self.now]
        for handle in due:
            if not handle.cancelled or not self.honour_cancel:
                handle.callback()

    @property
    def armed(self) -> int:
        """Timers neither fired nor cancelled."""
        return sum(not h.cancelled for h in self.timers)
