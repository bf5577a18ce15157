"""When a full edge resource (the pre-admission gate, a port's connections, the body budget)
will next have room: the ``Retry-After`` of its refusals (pure: times are passed in).

The measured interval between frees: k frees over the last window (or the resource's life, where
shorter) -> one every window / k. Where nothing freed in the window, the resource has been full
at least since its last free (or since it was made), and is taken to stay so as long again.
Clamped to [1 s, 60 s]: whole seconds for ``Retry-After``, within what the openai SDKs honour.
"""

from __future__ import annotations

from collections import deque

from sidecar.core.admission.retry_hint import MAX_RETRY_S

ROOM_WINDOW_S = 30.0
MIN_ROOM_S = 1.0


class RoomHint:
    """Frees of one resource, counted per whole second over ``window_s``: bounded memory
    whatever the rate."""

    def __init__(self, now: float, window_s: float = ROOM_WINDOW_S) -> None:
        self.window_s = window_s
        self._since = now  # the resource's start, or its last free
        self._made = now
        self._seconds: deque[list[int]] = deque()  # [whole second, frees in it], oldest first

    def freed(self, now: float) -> None:
        """One holder went at ``now``."""
        second = int(now)
        if self._seconds and self._seconds[-1][0] == second:
            self._seconds[-1][1] += 1
        else:
            self._seconds.append([second, 1])
        self._since = now
        self._prune(now)

    def wait_s(self, now: float) -> float:
        """Seconds until the resource is expected to have room again, from ``now``."""
        self._prune(now)
        frees = sum(count for _, count in self._seconds)
        # No free in the window: full since the last one, and taken to stay so as long again.
        wait = min(self.window_s, now - self._made) / frees if frees else now - self._since
        return min(MAX_RETRY_S, max(MIN_ROOM_S, wait))

    def _prune(self, now: float) -> None:
        oldest = int(now - self.window_s)
        while self._seconds and self._seconds[0][0] < oldest:
            self._seconds.popleft()
