"""The bounded edge: a cap on open client connections, a header deadline, OpenAI-shaped parser
errors that never echo the request, and a cap on the work done before admission.

aiohttp's protocol class is :class:`GuardedHandler` (a ``RequestHandler`` that refuses a
connection past the cap with a minimal 503, closes one whose request head is not complete in
time, and answers a malformed request in JSON); :class:`GuardedSite` listens with it.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_request import BaseRequest

from sidecar.core.errors import EdgeRefusedError
from sidecar.core.outcomes import EDGE_FAULTS, EdgeFault

log = structlog.get_logger("sidecar.edge.limits")


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """The edge's bounds, in plain values (built from the settings in the entry layer)."""

    max_connections: int = 512
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 15.0
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 64


@dataclass(slots=True)
class ConnectionCount:
    """Open client connections of one listening port."""

    limits: EdgeLimits
    open: int = 0
    refused: int = 0
    head_timeouts: int = 0
    by_fault: dict[str, int] = field(default_factory=dict)


def raw_answer(fault: EdgeFault) -> bytes:
    """A complete HTTP/1.1 answer for ``fault``: OpenAI-shaped JSON, then the connection closes."""
    refusal = EDGE_FAULTS[fault]
    body = json.dumps(
        {"error": {"message": refusal.message, "type": refusal.error_type, "param": None,
                   "code": refusal.code}}
    ).encode()  # fmt: skip
    retry = b"Retry-After: 1\r\n" if refusal.status == 503 else b""
    head = (
        f"HTTP/1.1 {refusal.status} {refusal.code}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode()
    return head + retry + b"\r\n" + body


class GuardedHandler(web.RequestHandler):
    """aiohttp's request handler with the edge's connection cap and header deadline."""

    __slots__ = ("_count", "_counted", "_head_timer", "_tail")

    def __init__(self, manager: web.Server, count: ConnectionCount, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._count = count
        self._counted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._count.open >= self._count.limits.max_connections:
            self._count.refused += 1
            _answer_and_close(transport, "too_many_connections")
            return
        self._counted = True
        self._count.open += 1
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(
            self._count.limits.header_timeout_s, self._head_expired, transport
        )
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None:
            seen = self._tail + data
            if b"\r\n\r\n" in seen:
                self._head_timer.cancel()
                self._head_timer = None
            self._tail = seen[-3:]
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._counted:
            return  # refused at the door: aiohttp never saw it
        self._counted = False
        self._count.open -= 1
        if self._head_timer is not None:
            self._head_timer.cancel()
        super().connection_lost(exc)

    def _head_expired(self, transport: asyncio.BaseTransport) -> None:
        self._head_timer = None
        self._count.head_timeouts += 1
        _answer_and_close(transport, "header_timeout")

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse: JSON, no echo of its bytes, no traceback."""
        log.info("bad_request", status=status, error=type(exc).__name__ if exc else None)
        if request.writer.output_size > 0:
            raise ConnectionError("the response had started; the connection is dropped")
        refusal = EDGE_FAULTS["bad_request"]
        body = {"error": {"message": refusal.message, "type": refusal.error_type, "param": None,
                          "code": refusal.code}}  # fmt: skip
        response = web.json_response(body, status=status if 400 <= status < 500 else 400)
        response.force_close()
        return response


def _answer_and_close(transport: asyncio.BaseTransport, fault: EdgeFault) -> None:
    if isinstance(transport, asyncio.WriteTransport) and not transport.is_closing():
        transport.write(raw_answer(fault))
    transport.close()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections are :class:`GuardedHandler` s, on a socket bound up front."""

    __slots__ = ("_count", "_handler_kwargs", "_sock")

    def __init__(
        self, runner: web.BaseRunner, sock: socket.socket, count: ConnectionCount, **kwargs: Any
    ) -> None:
        super().__init__(runner)
        self._sock, self._count, self._handler_kwargs = sock, count, kwargs

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, sock=self._sock, backlog=1024)

    def _protocol(self) -> GuardedHandler:
        server = self._runner.server
        assert server is not None
        return GuardedHandler(server, self._count, loop=asyncio.get_running_loop(),
                              **self._handler_kwargs)  # fmt: skip


class Gate:
    """At most ``limit`` requests being read, parsed or counted at once (``with gate:``); the
    next one is refused at once (503 ``edge_busy``), never queued.

    Its own context manager, with no state per entry: ``@contextmanager`` cost ~1.5 us a request.
    """

    __slots__ = ("_limit", "held", "refused")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.held = 0
        self.refused = 0

    def __enter__(self) -> None:
        if self.held >= self._limit:
            self.refused += 1
            raise EdgeRefusedError("edge_busy")
        self.held += 1

    def __exit__(self, *_exc: object) -> None:
        self.held -= 1
