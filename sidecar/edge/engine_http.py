"""A lean HTTP/1.1 client for the one engine the sidecar fronts.

aiohttp's client builds a request object, a response object, a URL, a cookie jar lookup, trace
hooks and a payload writer for every request, and wakes its reader once per HTTP chunk; on a
short stream that was about a third of the sidecar's CPU (docs/performance.md). The sidecar
talks to one origin, with bodies it has already read, and relays the answer's bytes as they are,
so it needs much less: a pool of kept-alive connections, one write per request, a response head,
and the body's bytes handed over in the largest pieces the socket gives.

Framing follows RFC 9112 §6.3: no body for HEAD, 1xx, 204 and 304; ``Transfer-Encoding: chunked``
over ``Content-Length`` (the connection is then not reused); a body with neither ends when the
engine closes. Interim 1xx answers are skipped. A connection goes back to the pool only when its
answer was read to the end and neither side asked to close it.

Failures are raised as the errors ``engine_client.translated`` maps: ``OSError`` (connect
refused, reset, an answer cut short: ``ConnectionResetError``), ``TimeoutError`` (connect, or no
byte for ``read_timeout_s``) and :class:`EngineProtocolError` (an answer that is not HTTP/1.x).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from multidict import CIMultiDict

# Past these the answer is refused, not buffered: they bound what one engine answer can cost.
MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE = 4 * 1024
# Body bytes held for a reader that is slower than the engine before the socket stops reading.
HIGH_WATER = 256 * 1024
# Idle kept-alive connections kept; more than the engine's concurrency gains nothing.
MAX_IDLE = 256

NO_BODY_STATUSES = frozenset({204, 304})
# Sent by the sidecar itself, whatever the client sent: the framing of the request it writes.
# Expect too: the body goes out with the head, so there is nothing for a 100 Continue to unblock.
OWN_FIELDS = frozenset({"host", "content-length", "transfer-encoding", "connection", "expect"})

Framing = Literal["none", "length", "chunked", "close"]


class EngineProtocolError(Exception):
    """The engine's answer broke HTTP/1.1 framing (or its connection closed before a head)."""


class UnsendableRequestError(EngineProtocolError):
    """A request line or field that HTTP/1.1 cannot carry (a line break, a NUL)."""


class _StaleConnectionError(ConnectionResetError):
    """A kept-alive connection that the engine had closed before it saw the request."""


class EngineConnection(asyncio.Protocol):
    """One connection to the engine; carries one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout_s: float) -> None:
        self._loop = loop
        self._read_timeout_s = read_timeout_s
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
        self._reset_message()

    def _reset_message(self) -> None:
        self.head: tuple[int, str, CIMultiDict[str]] | None = None
        self.framing: Framing = "none"
        self.keep_alive = True
        self.eof = False  # the body was read to its end
        self._remaining = 0  # Content-Length left, or the current chunk's bytes left
        self._chunk_state: Literal["size", "data", "data_end", "trailer"] = "size"
        self._head_request = False
        self._received = False  # any byte of this answer arrived

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._received = True
        self._last_data = self._loop.time()
        if self.head is None or self._buffer:
            self._buffer += data
            self._parse()
        elif self.framing == "chunked":  # the fast path: parsed straight off the socket's bytes
            self._chunks(data)
        else:
            self._body_bytes(data)
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
                error = _StaleConnectionError("the engine closed the connection before answering")
            else:
                error = ConnectionResetError("the engine closed the connection mid-answer")
            if exc is not None:
                error.__cause__ = exc
            self._error = self._error or error
        self._wake()

    def pause_writing(self) -> None:  # request bodies are small and written at once
        pass

    def resume_writing(self) -> None:
        pass

    # Parsing ---------------------------------------------------------------------------------

    def _parse(self) -> None:
        try:
            if self.head is None and not self._parse_head():
                return
            rest, self._buffer = bytes(self._buffer), bytearray()
            if self.framing == "chunked":
                self._parse_chunks(rest)
            elif rest:
                self._body_bytes(rest)
        except EngineProtocolError as exc:
            self._fail(exc)

    def _body_bytes(self, data: bytes) -> None:
        if self.framing == "length":
            self._take_length(data)
        elif self.framing == "close":
            self._hold(data)
        else:  # after a complete answer with no body, or while idle: not HTTP
            self._fail(EngineProtocolError("the engine sent bytes it was not asked for"))

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
            status, reason, fields, http10 = _parse_head(head)
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue, 103 Early Hints: the real answer follows
            self._frame(status, fields, http10=http10)
            self.head = (status, reason, fields)
            return True

    def _frame(self, status: int, fields: CIMultiDict[str], *, http10: bool) -> None:
        connection = {t.strip().lower() for t in fields.get("Connection", "").split(",")}
        self.keep_alive = not http10 and "close" not in connection
        if self._head_request or status in NO_BODY_STATUSES or status < 200:
            self.framing, self.eof = "none", True
            return
        coding = fields.getall("Transfer-Encoding", [])
        if coding:
            codings = [c.strip().lower() for value in coding for c in value.split(",")]
            if codings[-1] == "chunked":
                self.framing = "chunked"
            else:
                self.framing, self.keep_alive = "close", False
            if "Content-Length" in fields:
                self.keep_alive = False  # RFC 9112 §6.1: a request-smuggling shape; never reuse
            return
        lengths = fields.getall("Content-Length", [])
        if lengths:
            values = {v.strip() for value in lengths for v in value.split(",")}
            length = next(iter(values))
            if len(values) != 1 or not (length.isascii() and length.isdigit()):
                raise EngineProtocolError(f"the engine sent Content-Length {lengths!r}")
            self._remaining = int(length)
            self.framing = "length"
            self.eof = self._remaining == 0
            return
        self.framing, self.keep_alive = "close", False

    def _take_length(self, data: bytes) -> None:
        if len(data) > self._remaining:
            self._fail(EngineProtocolError("the engine sent more than its Content-Length"))
            return
        self._remaining -= len(data)
        self._hold(data)
        if self._remaining == 0:
            self.eof = True

    def _chunks(self, data: bytes) -> None:
        try:
            self._parse_chunks(data)
        except EngineProtocolError as exc:
            self._fail(exc)

    def _parse_chunks(self, data: bytes) -> None:
        """Parse whole chunks out of ``data``; keep a partial chunk line for the next bytes."""
        at = self._whole_chunks(data) if self._chunk_state == "size" else 0
        size = len(data)
        while at < size:
            state = self._chunk_state
            if state == "data":
                take = min(self._remaining, size - at)
                self._hold(data[at : at + take] if take < size else data)
                at += take
                self._remaining -= take
                if self._remaining == 0:
                    self._chunk_state = "data_end"
                continue
            end = data.find(b"\r\n", at)
            if end < 0:
                if size - at > MAX_CHUNK_LINE:
                    raise EngineProtocolError("the engine sent an overlong chunk line")
                self._buffer += data[at:]
                return
            line = data[at:end]
            at = end + 2
            if state == "size":
                self._remaining = _chunk_size(line)
                self._chunk_state = "data" if self._remaining else "trailer"
            elif state == "data_end":
                if line:
                    raise EngineProtocolError("the engine's chunk did not end where it said")
                self._chunk_state = "size"
            elif not line:  # the empty line after the last chunk (and any trailer fields)
                self.eof = True
                if at < size:
                    raise EngineProtocolError("the engine sent bytes after its answer")
                return

    def _whole_chunks(self, data: bytes) -> int:
        """The fast path, once per socket read: complete chunks with a bare hex size, back to
        back, taken in one tight loop; returns where the general state machine goes on."""
        at, size = 0, len(data)
        pieces = []
        while True:
            end = data.find(b"\r\n", at, at + 18)
            if end < 0:
                break
            line = data[at:end]
            if not line or line.strip(HEX_DIGITS):
                break  # an extension, or not a size at all: the general path says which
            start = end + 2
            stop = start + int(line, 16)
            if stop == start or stop + 2 > size:
                break  # the last chunk, or one not all here yet
            if data[stop : stop + 2] != b"\r\n":
                raise EngineProtocolError("the engine's chunk did not end where it said")
            pieces.append(data[start:stop])
            at = stop + 2
        if pieces:
            self._pieces += pieces
            self._held += sum(map(len, pieces))
            self._check_high_water()
        return at

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
        self._reset_message()
        self._head_request = head_request
        assert self.transport is not None
        self.transport.write(request)

    async def read_head(self) -> tuple[int, str, CIMultiDict[str]]:
        while self.head is None:
            await self._wait()
        return self.head

    async def read(self) -> bytes:
        """The body bytes that arrived since the last read (waiting for some); b"" at the end."""
        while not self._pieces:
            if self.eof:
                return b""
            await self._wait()
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
                raise _StaleConnectionError("the engine closed the connection before answering")
            raise ConnectionResetError("the engine's connection is closed")
        self._waiter = self._loop.create_future()
        if self._timer is None:
            self._last_data = self._loop.time()
            self._arm(self._read_timeout_s)
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _arm(self, delay: float) -> None:
        self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        """One timer per connection, re-armed lazily: no timer handle per relayed chunk."""
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


def _parse_head(head: bytes) -> tuple[int, str, CIMultiDict[str], bool]:
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise EngineProtocolError(f"the engine's status line is not HTTP/1.x: {lines[0][:80]!r}")
    fields: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or b" " in name or b"\t" in name:
            raise EngineProtocolError(f"the engine sent a malformed header line: {line[:80]!r}")
        # As aiohttp's parser does: UTF-8, with any other byte kept as it came.
        fields.add(
            name.decode("utf-8", "surrogateescape"),
            value.strip(b" \t").decode("utf-8", "surrogateescape"),
        )
    return int(code), reason.decode("utf-8", "replace"), fields, version == b"HTTP/1.0"


HEX_DIGITS = b"0123456789abcdefABCDEF"


def _chunk_size(line: bytes) -> int:
    digits = line.split(b";", 1)[0].rstrip(b" \t")  # a chunk extension is ignored
    if not digits or len(digits) > 16 or digits.strip(HEX_DIGITS):
        raise EngineProtocolError(f"the engine sent a bad chunk size: {line[:40]!r}")
    return int(digits, 16)


class EngineResponse:
    """The engine's status line, fields and body, read from one pooled connection."""

    __slots__ = ("_connection", "_pool", "headers", "reason", "status")

    def __init__(self, pool: EnginePool, connection: EngineConnection) -> None:
        assert connection.head is not None
        self.status, self.reason, self.headers = connection.head
        self._pool = pool
        self._connection: EngineConnection | None = connection

    @property
    def content_type(self) -> str:
        """The media type alone, lower case (``text/event-stream``)."""
        value = self.headers.get("Content-Type", "application/octet-stream")
        return value.split(";", 1)[0].strip().lower()

    async def read_chunk(self) -> bytes:
        connection = self._connection
        if connection is None:
            return b""
        return await connection.read()

    async def read_all(self) -> bytes:
        pieces = []
        while chunk := await self.read_chunk():
            pieces.append(chunk)
        return b"".join(pieces)

    def is_eof(self) -> bool:
        return self._connection is None or self._connection.eof

    def finish(self) -> None:
        """Back to the pool if the body was read to its end and may be reused; else closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.put_back(connection)


class EnginePool:
    """Kept-alive connections to one engine, reused most recent first."""

    def __init__(self, base_url: str, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        default_port = (self.https and self.port == 443) or (not self.https and self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_field = host if default_port else f"{host}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._idle: list[EngineConnection] = []
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.https else None
        self._closed = False

    async def request(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None
    ) -> EngineResponse:
        """Send one request; return once the engine's status line and fields arrived.

        A kept-alive connection that the engine had already closed (its keep-alive timeout
        raced our reuse) fails before one byte of an answer: the request is sent once more, on
        a new connection. Nothing else is retried.
        """
        message = self.encode(method, path_qs, headers, body)
        head_request = method == "HEAD"
        while True:
            connection = self._take_idle()
            reused = connection is not None
            if connection is None:
                connection = await self._connect()
            connection.send(message, head_request=head_request)
            try:
                await connection.read_head()
            except _StaleConnectionError:
                connection.close()
                if reused:
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            return EngineResponse(self, connection)

    def encode(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        lines = [f"{method} {self.prefix}{path_qs} HTTP/1.1", f"Host: {self.host_field}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in OWN_FIELDS]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = "\r\n".join(lines)
        # One scan for the whole head: a CR, LF or NUL inside a field would split it.
        if head.count("\n") != len(lines) - 1 or head.count("\r") != len(lines) - 1:
            msg = "a request line or header field holds a line break"
            raise UnsendableRequestError(msg)
        if "\x00" in head or " " in path_qs:
            msg = "a request line or header field holds a forbidden character"
            raise UnsendableRequestError(msg)
        encoded = (head + "\r\n\r\n").encode("utf-8", "surrogateescape")
        return encoded + body if body else encoded

    def _take_idle(self) -> EngineConnection | None:
        while self._idle:
            connection = self._idle.pop()
            transport = connection.transport
            if not connection.closed and transport is not None and not transport.is_closing():
                return connection
        return None

    async def _connect(self) -> EngineConnection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout_s):
            _, protocol = await loop.create_connection(
                lambda: EngineConnection(loop, self._read_timeout_s),
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self._ssl is not None else None,
            )
        return protocol

    def put_back(self, connection: EngineConnection) -> None:
        connection.cancel_timer()
        if self._closed or not connection.reusable or len(self._idle) >= MAX_IDLE:
            connection.close()
        else:
            self._idle.append(connection)

    def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
