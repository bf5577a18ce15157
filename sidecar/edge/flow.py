"""Flow control of one client connection, both ways: reading paused while a pipelined request
waits its turn, and writers held while the client's socket buffer is full (asyncio's
``pause_writing``/``resume_writing``) until it drains. An engine connection uses its reading
side: paused while body bytes wait for a slow reader."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class FlowControl:
    """Pause and resume reading from, and writing to, one transport."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.reading_paused = False
        self.writing_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._when_writable: Callable[[], None] | None = None

    def pause_reading(self) -> None:
        if not self.reading_paused:
            self.reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._writable.set()
        then, self._when_writable = self._when_writable, None
        if then is not None:
            then()

    async def drain(self) -> None:
        """Wait until the client's socket buffer has room (or the connection is gone)."""
        await self._writable.wait()

    def when_writable(self, then: Callable[[], None]) -> None:
        """Call ``then`` now if writing is not paused, else once it resumes."""
        if self.writing_paused:
            self._when_writable = then
        else:
            then()

    def release(self) -> None:
        """The connection is gone: nothing waits for room any more."""
        self._when_writable = None
        self._writable.set()
