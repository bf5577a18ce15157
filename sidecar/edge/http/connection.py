"""One client connection: an asyncio protocol over llhttp (httptools) that parses each request,
hands it to the port's handler, writes its answer, and bounds the connection's life.

A connection is always in one :class:`~sidecar.edge.http.states.State`, moved only by the rows
of one table; reading and writing are paused and resumed by its
:class:`~sidecar.edge.flow.FlowControl`; its one deadline at a time is a
:class:`~sidecar.edge.http.deadline.Deadline`.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

import httptools
import structlog

from sidecar.core.errors import SidecarError
from sidecar.core.outcomes import EdgeFault
from sidecar.edge.flow import FlowControl
from sidecar.edge.http.conformance import HeadRefusedError
from sidecar.edge.http.connections import ConnectionTable
from sidecar.edge.http.deadline import Deadline, Due
from sidecar.edge.http.errors import error_response
from sidecar.edge.http.head import Head
from sidecar.edge.http.limits import BodyBudget, EdgeLimits, raw_answer
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer, Response, StreamResponse
from sidecar.edge.http.states import READING, Event, State, next_state
from sidecar.edge.message import UnsendableHeadError

log = structlog.get_logger(__name__)

Handler = Callable[[Request], Awaitable[Answer]]

# How long a connection closed with its request body unread keeps reading it off.
LINGER_S = 1.0
# The bytes of an answer the kernel may hold unsent for a client (TCP_NOTSENT_LOWAT, where the
# platform has it). Without a bound Linux grows a socket's send buffer to tcp_wmem's maximum
# (4 MiB by default): a paced stream to a client that stopped reading then fills the kernel, not
# the transport, for minutes, and the write deadline never starts. With it, what a stalled client
# can leave unread is its own receive window, this, and the transport's high-water mark.
UNSENT_LIMIT = 16 * 1024
# Connections refused at the door that are still reading off what their client sent, so that it
# reads its 503 and not a reset: past this many the next one is closed at once.
MAX_LINGERING = 64
# A handler that failed, or an answer that cannot be sent: the same 500 as any unknown error.
INTERNAL_ERROR = error_response(SidecarError())


@dataclass
class Port:
    """What every connection of one listening port shares."""

    handler: Handler
    limits: EdgeLimits
    max_body_bytes: int
    connections: ConnectionTable[Connection]
    bodies: BodyBudget
    # Every refusal and deadline of the door (a cap, a head too slow, a head not HTTP/1.1).
    refused: Callable[[EdgeFault], None] = lambda _fault: None
    closing: bool = False  # shutting down: no connection is kept for another request
    lingering: int = 0  # refused connections reading off their client's bytes

    @property
    def max_head_bytes(self) -> int:
        """Head bytes past which a head that is still not complete is refused."""
        limits = self.limits
        return limits.max_line_size + limits.max_headers * (limits.max_field_size + 4)


def _client_address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


class Connection(asyncio.Protocol):
    """One client connection (and, for requests, their :class:`~sidecar.edge.http.request.Wire`)."""

    transport: asyncio.Transport
    _flow: FlowControl

    def __init__(self, port: Port) -> None:
        self._port, self._limits = port, port.limits
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._deadline = Deadline(self._loop, self._expired)
        self.state = State.IDLE
        self.task: asyncio.Task[None] | None = None  # the running handler's
        self._head: Head | None = None  # a head being received
        self._body_of: Request | None = None  # the request whose body is being received
        self._queue: deque[Request] = deque()  # pipelined, waiting for the answer before
        self.client = ""  # the peer's address
        self._lingers = False  # refused at the door, counted in port.lingering

    # asyncio's side.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not isinstance-checked: uvloop's do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        self._flow = FlowControl(self.transport)
        self.client = _client_address(transport)
        refused = self._port.connections.open(self, self.client)
        if refused is not None:
            self._refuse(refused)
            return
        # asyncio sets TCP_NODELAY only on sockets made with IPPROTO_TCP, which a listening
        # socket's accepted ones are not: without it a head sent alone holds back the first
        # event for the client's delayed ACK (40 ms).
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if hasattr(socket, "TCP_NOTSENT_LOWAT"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_LIMIT)
        self._deadline.set("head", self._limits.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self.state not in READING:
            return  # read off and dropped
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._move(Event.FINAL)  # what follows is not HTTP/1.1
        except httptools.HttpParserError as exc:
            self._parse_failed(exc)
            return
        if self._head is not None:
            self._head.size += len(data)
            if self._head.size > self._port.max_head_bytes:
                self._parse_failed(HeadRefusedError("the request head is too large"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._move(Event.LOST)
        if self._lingers:
            self._lingers = False
            self._port.lingering -= 1
        self._port.connections.close(self)
        self._deadline.clear()
        if self.task is not None:
            self.task.cancel()  # the client hung up: its handler ends now
        if self._body_of is not None:
            self._body_of.fail("cut_off")
        for queued in self._queue:
            queued.release()
        self._queue.clear()
        self._flow.release()

    def pause_writing(self) -> None:
        self._flow.pause_writing()

    def resume_writing(self) -> None:
        self._flow.resume_writing()

    # llhttp's callbacks (httptools).

    def on_message_begin(self) -> None:
        self._head = Head(self._limits)
        if self.task is not None:
            self._flow.pause_reading()  # pipelined: it waits for the answer before it
            return
        self._port.connections.mark(self, "partial")
        if self._deadline.due != "head":
            self._deadline.set("head", self._limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._receiving_head().add_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._receiving_head().add_field(name, value)

    def on_headers_complete(self) -> None:
        head = self._receiving_head()
        port = self._port
        request = head.request(
            self._parser, self.transport, self, port.max_body_bytes,
            budget=port.bodies, client=self.client,
        )  # fmt: skip
        self._head = None
        port.connections.mark(self, "busy")
        self._body_of = request if request.body_exists else None
        if self.task is None:
            self._deadline.clear()
            self._start(request)
        else:
            self._queue.append(request)

    def on_body(self, body: bytes) -> None:
        if self._body_of is not None:
            self._body_of.feed(body)

    def on_message_complete(self) -> None:
        if self._body_of is not None:
            self._body_of.end_of_body()
            self._body_of = None

    def _receiving_head(self) -> Head:
        assert self._head is not None, "llhttp calls on_message_begin first"
        return self._head

    # The answer's side (sidecar.edge.http.request.Wire).

    @property
    def paused(self) -> bool:
        return self._flow.writing_paused

    @property
    def lost(self) -> bool:
        return self.state is State.CLOSED

    async def drain(self) -> None:
        """Wait until the client's socket buffer has room; ConnectionResetError once it is gone."""
        await self._flow.drain()
        if self.lost:
            raise ConnectionResetError("the client's connection is closed")

    def keeps(self, request: Request) -> bool:
        """The connection's state says its answer is not the last, the port is not shutting
        down, and the request itself allows another after it."""
        return self.state is State.ACTIVE and not self._port.closing and request.allows_another

    def evict(self, fault: EdgeFault | None) -> None:
        """Closed to make room for a new connection: an idle one at once (RFC 9112 §9.5 lets a
        server close an idle connection at any time; a client retries on a new one), a partial
        head with ``fault``'s 503 (what it sent so far read off first)."""
        self._deadline.clear()
        if fault is None:
            self._move(Event.CLOSE)
            self.transport.close()
            return
        self._refuse(fault)

    def _refuse(self, fault: EdgeFault) -> None:
        """Refused at the door, or closed to make room: a 503 the client can read, never a bare
        reset. What it sent is read off for a moment first (closing with unread bytes would send
        a reset), while few refused connections are doing so: they hold descriptors beyond the
        port's cap."""
        port = self._port
        port.refused(fault)
        self.transport.write(raw_answer(fault))
        if port.lingering < MAX_LINGERING:
            port.lingering += 1
            self._lingers = True
            self._end(unread=True)
        else:
            self._move(Event.CLOSE)
            self.transport.close()

    def close_if_idle(self) -> None:
        if self.task is None and self.state is not State.CLOSED:
            self.transport.close()

    def abort(self) -> None:
        if self.state is not State.CLOSED:
            self.transport.abort()

    # Running requests.

    def _start(self, request: Request) -> None:
        self._move(Event.START)
        self.task = request.task = self._loop.create_task(self._serve(request))

    async def _serve(self, request: Request) -> None:
        try:
            response: Answer | None = await self._port.handler(request)
        except asyncio.CancelledError:
            request.release()
            # The client is gone, or the shutdown ended it, or a stop the handler did not turn
            # into an answer: no answer will come, so the connection ends (a stream unfinished).
            self.task = None
            if not self.lost:
                self._move(Event.CLOSE)
                self.transport.close()
            return
        except Exception:
            log.exception("proxy_handler_failed")
            response = None
        request.release()
        self.task = None
        if not self.lost:
            self._answered(request, response)

    def _answered(self, request: Request, response: Answer | None) -> None:
        keep = self._write_answer(request, response)
        if keep is None:  # the handler failed with its answer under way: cut it off
            self._move(Event.CLOSE)
            self.transport.abort()
        elif not keep:
            # Bytes may still be coming (a body, a pipelined request): read them off first.
            unread = not request.complete or self.state is State.LAST
            self._end(unread=unread or bool(self._queue) or self._head is not None)
        else:
            self._move(Event.KEEP)
            if self._flow.writing_paused:  # not reading: its next request waits until it does
                self._deadline.set("idle", self._limits.keepalive_timeout_s)
            self._flow.when_writable(self._next)

    def _write_answer(self, request: Request, response: Answer | None) -> bool | None:
        """Write what is left of the answer; whether the connection is kept (None: cut off)."""
        if isinstance(response, StreamResponse) and response.prepared:
            return response.finished and not response.closes and self.keeps(request)
        if isinstance(response, Response):
            keep = self.keeps(request)
            try:
                self.transport.write(response.encode(request, close=not keep))
            except UnsendableHeadError:
                self.transport.write(INTERNAL_ERROR.encode(request, close=True))
                return False
            return keep
        if request.started:
            return None
        self.transport.write(INTERNAL_ERROR.encode(request, close=True))
        return False

    def _next(self) -> None:
        self._flow.resume_reading()
        if self._queue:
            self._start(self._queue.popleft())
        elif self._head is not None:  # the next head has begun
            self._port.connections.mark(self, "partial")
            self._deadline.set("head", self._limits.header_timeout_s)
        else:
            self._port.connections.mark(self, "idle")
            self._deadline.set("idle", self._limits.keepalive_timeout_s)

    def _end(self, *, unread: bool) -> None:
        """Close once the answer is out; with bytes unread, half-close and read them off first."""
        self._move(Event.CLOSE)
        transport = self.transport
        if unread and transport.can_write_eof() and not transport.is_closing():
            transport.write_eof()
            self._flow.resume_reading()
            self._deadline.set("linger", LINGER_S)
        else:
            transport.close()

    def _move(self, event: Event) -> None:
        """The one way the state changes: a row of the table in :mod:`states`."""
        self.state = next_state(self.state, event)

    def _parse_failed(self, exc: Exception) -> None:
        reason = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
        log.info("bad_request", status=400, error=type(reason or exc).__name__)
        if self._body_of is not None:  # its handler answers (a 400 for its body), then we close
            self._body_of.fail("bad_framing")
            self._body_of = None
            self._move(Event.FINAL)
        elif self.task is None and not self._queue:
            # A rule of ours says which one it was, in our words; llhttp's errors quote bytes.
            message = str(reason) if isinstance(reason, HeadRefusedError) else None
            self._port.refused("bad_request")
            self.transport.write(raw_answer("bad_request", message))
            self._end(unread=True)
        else:  # the answer under way is the last
            self._move(Event.FINAL)

    def _expired(self, due: Due) -> None:
        if self.state is State.CLOSED:
            return
        transport = self.transport
        if due == "head":
            self._port.connections.count.head_timeouts += 1
            self._port.refused("header_timeout")
            self._move(Event.CLOSE)
            transport.write(raw_answer("header_timeout"))
            transport.close()
        elif transport.get_write_buffer_size() > 0:
            transport.abort()  # a client that stopped reading: close() would wait on it
        else:
            transport.close()
