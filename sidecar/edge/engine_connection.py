"""One kept-alive connection to the engine: an asyncio protocol that parses each answer.

Body bytes are parsed as they arrive and handed to the reader in the largest pieces a read gives;
at most ``HIGH_WATER`` of them wait for a slow reader before the socket stops being read. A reader
may instead attach a :data:`Sink`: each piece then goes to it from ``data_received``, with no task
woken, until the sink declines one (it keeps its place as the next read's) or the body ends (its
last bytes are the next read's). A read that is nothing but whole chunks reaches the sink with
the read itself, so that the relay can pass the engine's own chunk framing on. One read-timeout
timer per connection is re-armed lazily, so a relayed chunk costs no timer handle.

Failures are raised as the errors ``engine_client.translated`` maps: ``OSError`` (reset, an
answer cut short: ``ConnectionResetError``), ``TimeoutError`` (no byte for ``read_timeout_s``)
and :class:`EngineProtocolError` (an answer that is not HTTP/1.x).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from sidecar.edge.chunked import ChunkedBody
from sidecar.edge.http1 import (
    MAX_HEAD_BYTES,
    EngineProtocolError,
    Framing,
    Head,
    HeadCache,
    framing,
)

# Body bytes held for a reader that is slower than the engine before the socket stops reading.
HIGH_WATER = 256 * 1024
# Takes one piece of the body as it arrives and says whether it did; one it declines is left,
# untouched, for the next read (and the sink is detached). The second argument, where not None,
# is the socket read that carried the piece: nothing but whole chunks whose data is the piece.
Sink = Callable[[bytes, bytes | None], bool]


class StaleConnectionError(ConnectionResetError):
    """A kept-alive connection that the engine had closed before it saw the request."""


class EngineConnection(asyncio.Protocol):
    """One connection to the engine; carries one request at a time."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        read_timeout_s: float,
        heads: HeadCache | None = None,
    ) -> None:
        self._loop = loop
        self._read_timeout_s = read_timeout_s
        self._heads = heads if heads is not None else HeadCache()  # the pool's, shared
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()  # bytes received and not yet parsed
        self._pieces: list[bytes] = []  # body bytes parsed and not yet read
        self._held = 0  # their length
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0
        self._paused = False
        self._sink: Sink | None = None
        self.idle = False  # in the pool, between requests: any byte now is the engine's error
        self._reset_message()

    def _reset_message(self) -> None:
        self._sink = None
        self.head: Head | None = None
        self.framing: Framing = "none"
        self.keep_alive = True
        self.eof = False  # the body was read to its end
        self._remaining = 0  # Content-Length left
        self._chunks: ChunkedBody | None = None  # a chunked body's decoder
        self._head_request = False
        self._received = False  # any byte of this answer arrived

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not isinstance-checked: uvloop's do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.idle:
            self._fail(EngineProtocolError("the engine sent bytes on an idle connection"))
            return
        self._received = True
        self._last_data = self._loop.time()
        sink, chunks = self._sink, self._chunks
        if sink is not None and chunks is not None and not self._pieces and self._error is None:
            try:  # the hot path: one read of whole chunks (an event), straight to the sink
                piece = chunks.whole(data)
            except EngineProtocolError as exc:
                self._fail(exc)
                self._wake()
                return
            if piece is not None:
                if not sink(piece, data):
                    self._decline(piece)
                return
        try:
            if self.head is None:
                self._buffer += data
                self._parse()
            elif self._chunks is not None:  # decoded straight off the socket's bytes
                self._take_chunks(data)
            else:
                self._body_bytes(data)
        except EngineProtocolError as exc:
            self._fail(exc)
        sink = self._sink
        if sink is not None and self._pieces and not self.eof and self._error is None:
            self._push(sink)
        else:
            self._wake()

    def _push(self, sink: Sink) -> None:
        """Hand the pieces to ``sink``; the reader is woken only if it declines them."""
        data = self._take()
        if not sink(data, None):
            self._decline(data)

    def _decline(self, data: bytes) -> None:
        """The sink declined ``data``: detached, and ``data`` is the next read's, where it was."""
        self._sink = None
        self._hold(data)
        self._wake()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.cancel_timer()
        clean = exc is None and self._error is None
        if clean and self.head is not None and self.framing == "close" and not self.eof:
            self.eof = True  # a close-delimited body ends here; a reset is no end
        elif self._waiter is not None or (self.head is not None and not self.eof):
            error: BaseException
            if self.head is None and not self._received:
                error = StaleConnectionError("the engine closed the connection before answering")
            else:
                error = ConnectionResetError("the engine closed the connection mid-answer")
            if exc is not None:
                error.__cause__ = exc
            self._error = self._error or error
        self._wake()

    # Parsing ---------------------------------------------------------------------------------

    def _parse(self) -> None:
        if self.head is None and not self._parse_head():
            return
        rest, self._buffer = bytes(self._buffer), bytearray()
        if self._chunks is not None:
            self._take_chunks(rest)
        elif rest:
            self._body_bytes(rest)

    def _body_bytes(self, data: bytes) -> None:
        if self.framing == "length":
            self._take_length(data)
        elif self.framing == "close":
            self._hold(data)
        else:  # after a complete answer with no body: not HTTP
            raise EngineProtocolError("the engine sent bytes it was not asked for")

    def _parse_head(self) -> bool:
        """Parse a status line and fields if they are all here; skip interim 1xx answers."""
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    raise EngineProtocolError("the engine's response head is too large")
                return False
            if end > MAX_HEAD_BYTES:
                raise EngineProtocolError("the engine's response head is too large")
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            parsed = self._heads.parse(head)
            status = parsed.status
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue, 103 Early Hints: the real answer follows
            framed = parsed.framing
            if self._head_request:  # no body, whatever the fields say (RFC 9112 §6.3)
                framed = framing(status, parsed.fields, http10=parsed.http10, head_request=True)
            self._frame(framed)
            self.head = parsed
            return True

    def _frame(self, framed: tuple[Framing, int, bool]) -> None:
        self.framing, self._remaining, self.keep_alive = framed
        self.eof = self.framing == "none" or (self.framing == "length" and self._remaining == 0)
        if self.framing == "chunked":
            self._chunks = ChunkedBody()

    def _take_length(self, data: bytes) -> None:
        if len(data) > self._remaining:
            raise EngineProtocolError("the engine sent more than its Content-Length")
        self._remaining -= len(data)
        self._hold(data)
        if self._remaining == 0:
            self.eof = True

    def _take_chunks(self, data: bytes) -> None:
        assert self._chunks is not None
        if pieces := self._chunks.feed(data):
            self._pieces += pieces
            for piece in pieces:  # a loop, not sum(map(len, ...)): usually one piece
                self._held += len(piece)
            self._check_high_water()
        if self._chunks.done:
            self.eof = True

    def _hold(self, data: bytes) -> None:
        if data:
            self._pieces.append(data)
            self._held += len(data)
            self._check_high_water()

    def _check_high_water(self) -> None:
        if self._held > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _fail(self, exc: BaseException) -> None:
        self._error = self._error or exc
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # The reader's side -----------------------------------------------------------------------

    def send(self, request: bytes, *, head_request: bool) -> None:
        self.idle = False
        self._reset_message()
        # The read deadline counts from here: a timer left from the last answer re-arms by it.
        self._last_data = self._loop.time()
        self._head_request = head_request
        assert self.transport is not None
        self.transport.write(request)

    def push_to(self, sink: Sink | None) -> None:
        """Body pieces go to ``sink`` as they arrive (None: to the next read). Not while pieces
        wait: those are the next read's, and order is kept."""
        self._sink = sink if not self._pieces else None

    async def read_head(self) -> Head:
        while self.head is None:
            await self._wait()
        return self.head

    async def read(self) -> bytes:
        """The body bytes that arrived since the last read (waiting for some); b"" at the end."""
        while not self._pieces:
            if self.eof:
                return b""
            await self._wait()
        return self._take()

    def _take(self) -> bytes:
        """The pieces waiting, as one; the socket is read again if they had paused it."""
        pieces, self._pieces, self._held = self._pieces, [], 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        if self.closed:
            if self.head is None and not self._received:
                raise StaleConnectionError("the engine closed the connection before answering")
            raise ConnectionResetError("the engine's connection is closed")
        self._waiter = self._loop.create_future()
        if self._timer is None:
            self._last_data = self._loop.time()
            self._arm(self._read_timeout_s)
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._error is not None:  # a callback's, while this waited
            raise self._error

    def _arm(self, delay: float) -> None:
        self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        """One timer per connection, re-armed lazily: no timer handle per relayed chunk, nor
        per request (it outlives an answer: idle in the pool, it fires once and stays off)."""
        self._timer = None
        if self._waiter is None:
            return  # nobody reading: the next wait arms a fresh one
        idle = self._loop.time() - self._last_data
        if idle < self._read_timeout_s:
            self._arm(self._read_timeout_s - idle)
            return
        self._error = TimeoutError(f"no byte from the engine for {self._read_timeout_s:g}s")
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def has_pieces(self) -> bool:
        """Body bytes parsed and not yet read."""
        return bool(self._pieces)

    @property
    def failed(self) -> bool:
        return self._error is not None

    @property
    def reusable(self) -> bool:
        return (
            self.eof
            and self.keep_alive
            and not self.closed
            and self._error is None
            and not self._buffer
            and not self._pieces
        )

    def close(self) -> None:
        self.cancel_timer()
        self.keep_alive = False
        if self.transport is not None and not self.closed:
            self.transport.abort()  # vLLM aborts the request when its connection drops
