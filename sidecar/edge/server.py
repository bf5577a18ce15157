"""The sidecar's HTTP/1.1 server side, for both ports: one asyncio protocol per connection.

Heads and bodies are parsed by llhttp, the C parser Node.js uses (through httptools), strictly:
both Content-Length and Transfer-Encoding, two Content-Lengths, a bad chunk size or a bare LF are
refused, never guessed at (request smuggling); RFC 9112's rules on the head beyond llhttp's are
sidecar.edge.conformance's. Around it, the edge's bounds:

- at most ``max_connections`` open connections, ``max_connections_per_client`` from one address;
  at the first cap the longest idle connection is closed to make room, and only where none is
  idle does the new one get a minimal 503 and close;
- every request head must be complete within ``header_timeout_s`` of its first byte (the first
  one: of the connection's start), else a 408; an idle kept-alive connection is closed after
  ``keepalive_timeout_s``;
- a request line, a field, the number of fields and the whole head are bounded;
- a malformed request gets an OpenAI-shaped JSON 400 that echoes nothing;
- one request at a time per connection: a pipelined one waits (reading paused) for the answer
  before it; a client that hangs up cancels its handler at once.

The handler starts when the head is complete; the body is buffered into the :class:`Request` as
it arrives. A connection that closes with a body still unread half-closes first and reads off
what the client still sends for a second, so the client reads its answer, not a reset.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal, cast

import httptools
from multidict import CIMultiDict

from sidecar.core.errors import SidecarError
from sidecar.edge.conformance import HeadRefusedError, check_head
from sidecar.edge.connections import ConnectionTable
from sidecar.edge.http_errors import error_response
from sidecar.edge.limits import EdgeLimits, raw_answer
from sidecar.edge.request import Request
from sidecar.edge.response import Answer, Response, StreamResponse, UnsendableHeadError
from sidecar.telemetry.module_log import ModuleLogger

log = ModuleLogger("sidecar.edge.server")

Handler = Callable[[Request], Awaitable[Answer]]
Due = Literal["head", "idle", "linger"]

# How long a connection closed with its request body unread keeps reading it off.
LINGER_S = 1.0
# A deadline's timer fires up to this early and is not re-armed for it.
TIMER_SLACK_S = 0.001
# A handler that failed, or an answer that cannot be sent: the same 500 as any unknown error.
INTERNAL_ERROR = error_response(SidecarError())


def _client_address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


class HttpServer:
    """The listening side: every connection's :class:`Connection`, and the shutdown."""

    def __init__(self, handler: Handler, limits: EdgeLimits, *, max_body_bytes: int) -> None:
        self.handler, self.limits, self.max_body_bytes = handler, limits, max_body_bytes
        self.connections: ConnectionTable[Connection] = ConnectionTable(
            limits.max_connections, limits.max_connections_per_client
        )
        self.count = self.connections.count
        self.closing = False
        # Head bytes past which a head that is still not complete is refused.
        self.max_head_bytes = limits.max_line_size + limits.max_headers * (
            limits.max_field_size + 4
        )
        self._server: asyncio.Server | None = None

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self), sock=sock, backlog=1024)

    async def close(self, timeout_s: float) -> None:
        """Stop listening, close idle connections, give running handlers ``timeout_s``, then end
        the rest (their handlers cancelled)."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close_if_idle()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for connection in list(self.connections):
            if connection.task is None:
                connection.close_if_idle()
            else:
                connection.abort()
        await asyncio.sleep(0)  # their connection_lost callbacks
        if self._server is not None:
            await self._server.wait_closed()


class Connection(asyncio.Protocol):
    """One client connection: parse, bound, hand each request to the handler, write its answer."""

    def __init__(self, server: HttpServer) -> None:
        self._server, self._limits = server, server.limits
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.paused = self.lost = False
        self.task: asyncio.Task[None] | None = None  # the running handler's
        self._counted = False
        self._parsing: Request | None = None  # the request whose body is being read
        self._queue: deque[Request] = deque()  # pipelined, waiting for the answer before
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []  # the head's, as llhttp gives them
        self._in_head = False
        self._head_bytes = 0
        self._unusable = False  # parse error, upgrade or linger: later bytes are not parsed
        self._drain: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due: Due | None = None
        self._deadline = 0.0
        self._next_waits = False  # the next request waits for the client to read this answer

    # asyncio's side.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not isinstance-checked: uvloop's do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        refused = self._server.connections.open(self, _client_address(transport))
        if refused is not None:
            self.transport.write(raw_answer(refused))
            self.transport.close()
            return
        self._counted = True
        # asyncio sets TCP_NODELAY only on sockets made with IPPROTO_TCP, which a listening
        # socket's accepted ones are not: without it a head sent alone holds back the first
        # event for the client's delayed ACK (40 ms).
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm("head", self._limits.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._unusable or not self._counted:
            return  # read off and dropped
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unusable = True  # what follows is not HTTP/1.1: this answer is the last
        except httptools.HttpParserError as exc:
            self._parse_failed(exc)
            return
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > self._server.max_head_bytes:
                self._parse_failed(HeadRefusedError("the request head is too large"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self._counted:
            return  # refused at the door
        self._counted = False
        self._server.connections.close(self)
        if self._timer is not None:
            self._timer.cancel()
        if self.task is not None:
            self.task.cancel()  # the client hung up: its handler ends now
        if self._parsing is not None:
            self._parsing.fail("cut_off")
        self._queue.clear()
        self._wake_writer()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_writer()
        if self._next_waits:
            self._next_waits = False
            self._next()

    # llhttp's callbacks (httptools).

    def on_message_begin(self) -> None:
        self._in_head, self._head_bytes, self._url, self._fields = True, 0, b"", []
        self._server.connections.set_idle(self, idle=False)
        if self.task is not None:
            self._transport().pause_reading()  # pipelined: it waits for the answer before it
        elif self._due != "head":
            self._arm("head", self._limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._limits.max_line_size:
            raise HeadRefusedError("the request line is too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        # A call per field (~10 a request from an SDK): counted here, so that what one read can
        # pile up stays bounded; measured and decoded once, when the head is whole.
        fields = self._fields
        if len(fields) >= self._limits.max_headers:
            raise HeadRefusedError("too many header fields")
        fields.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        longest, fields = self._limits.max_field_size, []
        for name, value in self._fields:
            if len(name) + len(value) > longest:
                raise HeadRefusedError("a header field is too long")
            fields.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))
        headers = CIMultiDict(fields)
        head = check_head(
            parser.get_http_version(),
            self._url.decode("utf-8", "surrogateescape"),
            headers,
            keep_alive=parser.should_keep_alive(),
            upgrade=parser.should_upgrade(),
        )
        limit = self._server.max_body_bytes
        request = Request(
            parser.get_method().decode("ascii"),
            head.target,
            head.version,
            headers,
            transport=self._transport(),
            wire=self,
            client_max_size=limit,
            keep_alive=head.keep_alive,
            body_exists=head.body_exists,
        )
        self._parsing = request if head.body_exists else None
        declared = headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            request.fail("too_large")  # refused at once: no 100 Continue, no wait for the body
        if self.task is None:
            self._due = None
            self._start(request)
        else:
            self._queue.append(request)

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing.feed(body)

    def on_message_complete(self) -> None:
        if self._parsing is not None:
            self._parsing.finish()
            self._parsing = None

    # The answer's side (sidecar.edge.request.Wire).

    async def drain(self) -> None:
        """Wait until the client's socket buffer has room; ConnectionResetError once it is gone."""
        if self.paused and not self.lost:
            self._drain = self._loop.create_future()
            try:
                await self._drain
            finally:
                self._drain = None
        if self.lost:
            raise ConnectionResetError("the client's connection is closed")

    def keeps(self, request: Request) -> bool:
        return (
            request.keep_alive
            and request.complete
            and request.fault is None
            and not self._unusable
            and not self._server.closing
        )

    def evict(self) -> None:
        """Closed while idle to make room for a new connection (RFC 9112 §9.5 lets a server
        close an idle connection at any time; a client retries on a new one)."""
        self._transport().close()

    def close_if_idle(self) -> None:
        if self.task is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # Running requests.

    def _start(self, request: Request) -> None:
        self.task = request.task = self._loop.create_task(self._serve(request))

    async def _serve(self, request: Request) -> None:
        try:
            response: Answer | None = await self._server.handler(request)
        except asyncio.CancelledError:
            # The client is gone, or the shutdown ended it, or a stop the handler did not turn
            # into an answer: no answer will come, so the connection ends (a stream unfinished).
            self.task = None
            if not self.lost:
                self._transport().close()
            return
        except Exception:
            log.exception("proxy_handler_failed")
            response = None
        self.task = None
        if not self.lost:
            self._answered(request, response)

    def _answered(self, request: Request, response: Answer | None) -> None:
        transport = self._transport()
        if isinstance(response, StreamResponse) and response.prepared:
            keep = response.finished and not response.closes and self.keeps(request)
        elif isinstance(response, Response):
            keep = self.keeps(request)
            try:
                transport.write(response.encode(request, close=not keep))
            except UnsendableHeadError:
                keep = False
                transport.write(INTERNAL_ERROR.encode(request, close=True))
        elif request.started:  # the handler failed with its answer under way: cut it off
            transport.abort()
            return
        else:
            keep = False
            transport.write(INTERNAL_ERROR.encode(request, close=True))
        if not keep:
            # Bytes may still be coming (a body, a pipelined request): read them off first.
            self._end(unread=not request.complete or self._unusable or bool(self._queue)
                      or self._in_head)  # fmt: skip
        elif self.paused:  # the client is not reading: its next request waits until it does
            self._next_waits = True
            self._arm("idle", self._limits.keepalive_timeout_s)
        else:
            self._next()

    def _next(self) -> None:
        transport = self._transport()
        transport.resume_reading()
        if self._queue:
            self._start(self._queue.popleft())
        elif self._in_head:  # the next head has begun
            self._arm("head", self._limits.header_timeout_s)
        else:
            self._server.connections.set_idle(self, idle=True)
            self._arm("idle", self._limits.keepalive_timeout_s)

    def _end(self, *, unread: bool) -> None:
        """Close once the answer is out; with a body unread, half-close and read it off first."""
        transport = self._transport()
        if unread and transport.can_write_eof() and not transport.is_closing():
            self._unusable = True
            transport.write_eof()
            transport.resume_reading()
            self._arm("linger", LINGER_S)
        else:
            transport.close()

    def _parse_failed(self, exc: Exception) -> None:
        self._unusable = True
        reason = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
        log.info("bad_request", status=400, error=type(reason or exc).__name__)
        # A rule of ours says which one it was, in our words; llhttp's errors quote the bytes.
        message = str(reason) if isinstance(reason, HeadRefusedError) else None
        if self._parsing is not None:  # its handler answers (a 400 for its body), then we close
            self._parsing.fail("bad_framing")
            self._parsing = None
            return
        if self.task is None and not self._queue:
            self._transport().write(raw_answer("bad_request", message))
            self._end(unread=True)

    # One timer per connection for its deadline, moved only when a nearer one is set. It is set
    # to fire no later than a head deadline set from now would, so the next request's head
    # deadline never moves it: no timer made or cancelled per request.

    def _arm(self, due: Due, seconds: float) -> None:
        self._due = due
        now = self._loop.time()
        self._deadline = deadline = now + seconds
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            wake = now + min(seconds, self._limits.header_timeout_s)
            self._timer = self._loop.call_at(wake, self._expired)

    def _expired(self) -> None:
        self._timer = None
        due = self._due
        if due is None or self.lost:
            return
        now = self._loop.time()
        if now + TIMER_SLACK_S < self._deadline:
            wake = min(self._deadline, now + self._limits.header_timeout_s)
            self._timer = self._loop.call_at(wake, self._expired)
            return
        self._due = None
        transport = self._transport()
        if due == "head":
            self._server.count.head_timeouts += 1
            self._unusable = True
            transport.write(raw_answer("header_timeout"))
        if transport.get_write_buffer_size() > 0 and due != "head":
            transport.abort()  # a client that stopped reading: close() would wait on it
        else:
            transport.close()

    def _wake_writer(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _transport(self) -> asyncio.Transport:
        assert self.transport is not None
        return self.transport
