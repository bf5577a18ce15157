"""Reading from a socket paused and resumed, once each, as uvicorn's ``FlowControl`` does."""

from __future__ import annotations

import asyncio


class FlowControl:
    """Whether a transport's reading is paused; pausing twice, or resuming a running one, is a
    no-op, so callers need not track it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.read_paused = False

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self._transport.resume_reading()
