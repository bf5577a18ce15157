"""Flow control of one client connection, both ways: reading paused while a pipelined request
waits its turn, writers held while the client's socket buffer is full (asyncio's
``pause_writing``/``resume_writing``) until it drains, and the next pipelined request held until
the answer before it has left the buffer entirely, and reading stopped for a rest (the read floor:
:mod:`sidecar.edge.http.read_floor`) whatever else pauses or resumes it meanwhile. An engine
connection uses its reading side: paused while body bytes wait for a slow reader. What of the
answers written the client's TCP has not yet acknowledged is :meth:`FlowControl.unacknowledged`'s
to say."""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from collections.abc import Callable

from sidecar.limiter.expiry import CallLater, TimerHandle


class FlowControl:
    """Pause and resume reading from, and writing to, one transport."""

    def __init__(
        self,
        transport: asyncio.Transport,
        *,
        clock: Callable[[], float] | None = None,
        call_later: CallLater | None = None,
    ) -> None:
        """``clock`` and ``call_later`` time a rest (default: the running loop's)."""
        self._transport = transport
        self._clock = clock
        self._call_later = call_later
        self.reading_paused = False
        self.writing_paused = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._when_writable: Callable[[], None] | None = None
        self._limits: tuple[int, int] | None = None  # (low, high) to restore, once flushed
        self._rest: TimerHandle | None = None  # ends the rest under way
        self._rest_began = 0.0  # on the clock

    def pause_reading(self) -> None:
        if not self.reading_paused:
            self.reading_paused = True
            if self._rest is None:
                self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            if self._rest is None:
                self._transport.resume_reading()

    def rest(self, seconds: float) -> None:
        """Stop reading for ``seconds``, whatever resumes it meanwhile: what the peer sends waits
        in the kernel, and is read at once (as one read, as far as the buffer holds) after."""
        if self._rest is not None or self._transport.is_closing():
            return
        if not self.reading_paused:
            self._transport.pause_reading()
        call_later = self._call_later or asyncio.get_running_loop().call_later
        self._rest_began = self._now()
        self._rest = call_later(seconds, self._rested)

    def rested_s(self) -> float:
        """How long the rest under way has lasted; 0 where none is."""
        if self._rest is None:
            return 0.0
        return self._now() - self._rest_began

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _rested(self) -> None:
        self._rest = None
        if not self.reading_paused and not self._transport.is_closing():
            self._transport.resume_reading()

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._writable.set()
        if self._limits is not None:
            low, high = self._limits
            self._limits = None
            self._transport.set_write_buffer_limits(high=high, low=low)
        then, self._when_writable = self._when_writable, None
        if then is not None:
            then()

    async def drain(self) -> None:
        """Wait until the client's socket buffer has room (or the connection is gone)."""
        await self._writable.wait()

    def when_flushed(self, then: Callable[[], None]) -> bool:
        """Call ``then`` once the transport holds nothing unwritten: now (True), or once its
        buffer has drained to empty (False): until then the limits are 0, so that the transport
        pauses writing now and resumes only when empty, as asyncio's flow control says."""
        if self._transport.get_write_buffer_size() == 0 and not self.writing_paused:
            then()
            return True
        self._when_writable = then
        if self._limits is None:
            self._limits = self._transport.get_write_buffer_limits()
            self._transport.set_write_buffer_limits(high=0, low=0)
        return False

    def unacknowledged(self) -> int:
        """Bytes written to this connection that its peer's TCP has not yet acknowledged: the
        transport's buffer and the kernel's send queue (SIOCOUTQ, Linux's name for TIOCOUTQ on a
        TCP socket); where the kernel cannot say, the transport's buffer alone."""
        held = self._transport.get_write_buffer_size()
        sock = self._transport.get_extra_info("socket")
        if sock is None:
            return held
        try:
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, bytes(4))
        except (OSError, ValueError):  # not a socket that has one, or closed
            return held
        return held + int(struct.unpack("i", queued)[0])

    def release(self) -> None:
        """The connection is gone: nothing waits for room any more, nor rests."""
        if self._rest is not None:
            self._rest.cancel()
            self._rest = None
        self._when_writable = None
        self._writable.set()
