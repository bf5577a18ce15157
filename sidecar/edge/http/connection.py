"""One client connection: an asyncio protocol that hands each request its
:class:`~sidecar.edge.http.reader.RequestReader` parses to the port's handler, writes its answer,
and bounds the connection's life.

Its state, its deadline and the ways it ends are its :class:`~sidecar.edge.http.life.Life`'s;
reading and writing are paused and resumed by its :class:`~sidecar.edge.flow.FlowControl`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast

import httptools
import structlog

from sidecar.core.outcomes import EdgeFault
from sidecar.edge.conformance import HeadRefusedError
from sidecar.edge.flow import FlowControl
from sidecar.edge.http.life import Life
from sidecar.edge.http.port import MAX_AHEAD, Port, client_address, tune_socket
from sidecar.edge.http.read_floor import REST_S
from sidecar.edge.http.reader import ChunksTooSmallError, RequestReader
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer, rest_of_answer
from sidecar.edge.http.states import READING, Event, State
from sidecar.edge.message import raw_answer

log = structlog.get_logger(__name__)


class Connection(asyncio.Protocol):
    """One client connection (and, for requests, their :class:`~sidecar.edge.http.request.Wire`)."""

    transport: asyncio.Transport
    _flow: FlowControl
    _life: Life

    def __init__(self, port: Port[Connection]) -> None:
        self._port, self._limits = port, port.limits
        self._loop = asyncio.get_running_loop()
        self._reader = RequestReader(self, port)
        self.task: asyncio.Task[None] | None = None  # the running handler's
        self._flushing = False  # an answer is leaving: the next request waits until it has
        self._ahead = 0  # requests run in a row, each read before the answer before it arrived
        self._queue: deque[Request] = deque()  # pipelined, waiting for the answer before
        self.client = ""  # the peer's address

    # asyncio's side.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not isinstance-checked: uvloop's do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        self._flow = FlowControl(self.transport)
        self._life = Life(self.transport, self._flow, self._port)
        self.client = client_address(transport)
        refused = self._port.connections.open(self, self.client)
        if refused is not None:
            self._life.refuse(refused)
            return
        tune_socket(transport)
        self._life.deadline.set("head", self._limits.header_timeout_s)

    @property
    def state(self) -> State:
        return self._life.state

    def data_received(self, data: bytes) -> None:
        if self.state not in READING:
            return  # read off and dropped
        self._parse(data)
        if self._reader.short_read(len(data)) and self.state in READING:
            self._port.connections.count.rests += 1
            self._flow.rest(REST_S)

    def _parse(self, data: bytes | None) -> None:
        """Parse ``data`` (None: the backlog) up to the request after the one running; reading
        stops while read bytes wait unparsed."""
        reader = self._reader
        try:
            if data is None:
                reader.resume()
            else:
                reader.take(data)
        except httptools.HttpParserUpgrade:
            self._life.move(Event.FINAL)  # what follows is not HTTP/1.1
        except (httptools.HttpParserError, HeadRefusedError) as exc:
            self._parse_failed(exc)
            return
        if reader.backlog:
            self._flow.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._life.lost()
        self._port.connections.close(self)
        if self.task is not None:
            self.task.cancel()  # the client hung up: its handler ends now
        if self._reader.body_of is not None:
            self._reader.body_of.fail("cut_off")
        self._drop_queued()
        self._flow.release()

    def _drop_queued(self) -> None:
        for queued in self._queue:
            queued.release()
        self._queue.clear()
        self._reader.backlog.clear()

    def pause_writing(self) -> None:
        self._flow.pause_writing()

    def resume_writing(self) -> None:
        self._flow.resume_writing()

    # The reader's side (sidecar.edge.http.reader.Receiver).

    def head_begun(self) -> None:
        if self.running():
            self._flow.pause_reading()  # pipelined: it waits for the answer before it
            return
        self._port.connections.mark(self, "partial")
        if self._life.deadline.due != "head":
            self._life.deadline.set("head", self._limits.header_timeout_s)

    def received(self, request: Request) -> None:
        self._port.connections.mark(self, "busy")
        if not self.running():
            self._life.deadline.clear()
            self._start(request)
        elif not self._queue:
            self._queue.append(request)
        else:
            # Parsed two ahead (a chunked body's slice held more heads): nothing after the
            # running request is served; its answer is the last (a pipelining client retries).
            request.release()
            self._drop_queued()
            self._life.move(Event.FINAL)

    def running(self) -> bool:
        return self.task is not None or self._flushing

    def takes_more(self) -> bool:
        return self.state in READING and not self._queue

    # The answer's side (sidecar.edge.http.request.Wire).

    @property
    def paused(self) -> bool:
        return self._flow.writing_paused

    @property
    def lost(self) -> bool:
        return self._life.closed

    async def drain(self) -> None:
        """Wait until the client's socket buffer has room; ConnectionResetError once it is gone."""
        await self._flow.drain()
        if self.lost:
            raise ConnectionResetError("the client's connection is closed")

    def rested_s(self) -> float:
        return self._flow.rested_s()

    def keeps(self, request: Request) -> bool:
        """Whether the connection is kept after ``request``'s answer, as its state says; a request
        that does not allow another after it (its client asked to close, its body was not read
        whole) makes its answer the last, now."""
        if self.state is State.ACTIVE and not request.allows_another:
            self._life.move(Event.NO_KEEP_ALIVE)
        return self.state is State.ACTIVE

    def shut_down(self) -> None:
        """The port is shutting down: an idle connection closes now, a running request's
        answer is the last."""
        if self.task is None:
            self.close_if_idle()
        elif self.state is State.ACTIVE:  # else its answer is the last already
            self._life.move(Event.NO_KEEP_ALIVE)

    def evict(self, fault: EdgeFault | None) -> None:
        """Closed to make room for a new connection: an idle one at once (RFC 9112 §9.5 lets a
        server close an idle connection at any time; a client retries on a new one), a partial
        head with ``fault``'s 503 (what it sent so far read off first); a busy one that waits on
        its client ends its body as too slow (its handler answers 408), or, not reading its
        answer, is cut off."""
        if self.task is not None:
            body = self._reader.body_of
            if body is not None:
                body.stall()
            else:
                self.abort()
            return
        self._life.deadline.clear()
        if fault is None:
            self._life.close()
        else:
            self._life.refuse(fault)

    def waiting_on_client(self) -> int | None:
        body = self._reader.body_of
        if body is not None:
            return body.received
        return 0 if self._flow.writing_paused else None

    def held_bytes(self) -> int:
        body = self._reader.body_of
        held = len(self._reader.backlog) + self.transport.get_write_buffer_size()
        return held + (body.received if body is not None else 0)

    def close_if_idle(self) -> None:
        if self.task is None:
            self._life.close_if_open()

    def abort(self) -> None:
        self._life.abort_if_open()

    # Running requests.

    def _start(self, request: Request, *, ahead: bool = False) -> None:
        """Run ``request``'s handler. One ``ahead`` of its client's reads (read before the answer
        before it had left, or sent before the client's TCP had all of that answer) counts
        towards MAX_AHEAD; the one that reaches it gets the connection's last answer."""
        self._ahead = self._ahead + 1 if ahead or self._flow.unacknowledged() else 0
        self._life.move(Event.START)
        if self._ahead >= MAX_AHEAD and self.state is State.ACTIVE:
            self._life.move(Event.NO_KEEP_ALIVE)
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
                self._life.close()
            return
        except Exception:
            log.exception("proxy_handler_failed")
            response = None
        request.release()
        self.task = None
        if not self.lost:
            self._answered(request, response)

    def _answered(self, request: Request, response: Answer | None) -> None:
        out, keep = rest_of_answer(request, response, self.keeps)
        if out:
            self.transport.write(out)
        if keep is None:  # the handler failed with its answer under way: cut it off
            self._life.cut_off()
        elif not keep:
            # Bytes may still be coming (a body, a pipelined request): read them off first.
            unread = not request.complete or self.state is State.LAST or bool(self._queue)
            unread = unread or self._reader.head is not None or bool(self._reader.backlog)
            self._life.end(unread=unread)
        else:
            self._life.move(Event.KEEP)
            # The next request runs once this answer has left the sidecar: a client that does
            # not read gets none run for it, and its next waits (until the keep-alive deadline).
            self._flushing = True
            if not self._flow.when_flushed(self._next):
                self._life.deadline.set("idle", self._limits.keepalive_timeout_s)

    def _next(self) -> None:
        """The answer before has left: run what was read behind it (ahead of the client's
        reads), and read one request ahead of that."""
        self._life.deadline.clear()
        self._parse(None)  # a head that completes now is queued: it was read before the answer
        self._flushing = False
        if self._queue:
            self._start(self._queue.popleft(), ahead=True)
            self._parse(None)  # what was read behind it: its body, and the head after it
        if self.state not in READING or self._reader.backlog:
            return
        self._flow.resume_reading()
        if self.task is not None:
            return
        if self._reader.head is not None:  # the next head has begun
            self._port.connections.mark(self, "partial")
            self._life.deadline.set("head", self._limits.header_timeout_s)
        else:
            self._port.connections.mark(self, "idle")
            self._life.deadline.set("idle", self._limits.keepalive_timeout_s)

    def _parse_failed(self, exc: Exception) -> None:
        reason = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
        log.info("bad_request", status=400, error=type(reason or exc).__name__)
        reader = self._reader
        if reader.body_of is not None:  # its handler answers (a 400 for its body), then we close
            tiny = isinstance(reason, ChunksTooSmallError)
            reader.body_of.fail("tiny_chunks" if tiny else "bad_framing")
            reader.body_of = None
            self._life.move(Event.FINAL)
        elif self.task is None and not self._queue:
            # A rule of ours says which one it was, in our words; llhttp's errors quote bytes.
            message = str(reason) if isinstance(reason, HeadRefusedError) else None
            self._port.refused("bad_request")
            self.transport.write(raw_answer("bad_request", message))
            self._life.end(unread=True)
        else:  # the answer under way is the last
            self._life.move(Event.FINAL)
