"""A pooled HTTP/1.1 client for the one engine the sidecar fronts.

The sidecar talks to one origin, with bodies it has already read, and relays the answer's bytes
as they come, so a client this small does: a pool of kept-alive connections
(:mod:`connection`, llhttp parsing each answer), one write per request (:mod:`http1`
encodes it), a response head, and the body's bytes as they arrive.

A connection goes back to the pool only when its answer was read to the end and neither side
asked to close it, and is taken from it only while it has been idle under ``MAX_IDLE_S``: an
engine closes a connection it kept idle for its keep-alive timeout, and a request sent on it at
that instant gets no answer. A request is written once, except where RFC 9112 §9.3.1 allows
another try: an idempotent request on a kept-alive connection that the engine closed without
answering. A POST may have reached the engine, which may be generating for it: it is never sent
twice.
Errors: as in :mod:`sidecar.edge.engine.connection`, plus ``OSError`` and ``TimeoutError`` on
connect.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from sidecar.edge.engine.connection import EngineConnection, Sink
from sidecar.edge.engine.errors import StaleConnectionError
from sidecar.edge.engine.http1 import encode_request
from sidecar.edge.engine.states import Phase

# Idle kept-alive connections kept; more than the engine's concurrency gains nothing.
MAX_IDLE = 256
# Seconds a kept-alive connection may wait for its next request before it is closed instead of
# reused. vLLM's API server (uvicorn) closes one idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by
# default, and it may do so late, under load; a new loopback connection costs well under a
# millisecond, so the bound errs low. An engine whose keep-alive is shorter needs this lower.
MAX_IDLE_S = 2.0
# RFC 9110 §9.2.2: a request the engine may see twice with the effect of once.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class EngineResponse:
    """The engine's status line, fields and body, read from one pooled connection."""

    def __init__(self, pool: EnginePool, connection: EngineConnection) -> None:
        head = connection.head
        assert head is not None
        self.status, self.reason, self.headers = head.status, head.reason, head.fields
        self.forwarded = head.forwarded  # the fields a proxy passes on (http1.end_to_end_fields)
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

    def push_to(self, sink: Sink | None) -> None:
        """Body pieces go to ``sink`` from the socket's callback until it declines one, the
        body ends or an error comes; then the next read has them (see EngineConnection)."""
        if self._connection is not None:
            self._connection.push_to(sink)

    def is_eof(self) -> bool:
        """The body was read to its end (after a read: the next read returns b"")."""
        connection = self._connection
        return connection is None or (connection.ended and not connection.has_pieces)

    def ready(self) -> bool:
        """The next read returns at once: body bytes, its end, or an error are here already."""
        connection = self._connection
        return (
            connection is None
            or connection.has_pieces
            or connection.ended
            or connection.phase is Phase.BROKEN
        )

    def release(self) -> None:
        """Back to the pool if the body was read to its end and may be reused; else closed."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.put_back(connection)


class EnginePool:
    """Kept-alive connections to one engine, reused most recent first."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        engine_silence: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``engine_silence``: seconds since the engine last answered its probe (None: not
        probed); a request still waiting for its answer's first byte is not timed out while
        the engine answers (:class:`~sidecar.edge.engine.connection.EngineConnection`).
        ``clock``: seconds, for how long a connection has been idle."""
        parts = urlsplit(base_url)
        self._engine_silence = engine_silence
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        default_port = (self.https and self.port == 443) or (not self.https and self.port == 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_field = host if default_port else f"{host}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._clock = clock
        self._idle: list[tuple[float, EngineConnection]] = []  # (parked at, it), oldest first
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.https else None
        self._closed = False

    async def request(
        self,
        method: str,
        path_qs: str,
        headers: Mapping[str, str],
        body: bytes | None,
        sent: Callable[[], object] | None = None,
    ) -> EngineResponse:
        """Send one request; return once the engine's status line and fields arrived.

        A kept-alive connection that the engine closed without one byte of an answer (its
        keep-alive timeout raced our reuse) is replaced and the request sent once more, only
        where the request is idempotent; else that is a StaleConnectionError (a 502).

        ``sent``: called once the request is first written, before the wait for the answer:
        work that need not delay the engine (a log line) runs while the engine works.
        """
        message = encode_request(method, self.prefix + path_qs, self.host_field, headers, body)
        retry = method in IDEMPOTENT_METHODS
        while True:
            connection = self._take_idle()
            reused = connection is not None
            if connection is None:
                connection = await self._connect()
            connection.send(message, head_request=method == "HEAD")
            try:
                if sent is not None:
                    sent()
                    sent = None  # not again on a retry
                await connection.read_head()
            except StaleConnectionError:
                connection.close()
                if reused and retry:
                    continue
                raise
            except BaseException:
                connection.close()
                raise
            return EngineResponse(self, connection)

    def _take_idle(self) -> EngineConnection | None:
        fresh_since = self._clock() - MAX_IDLE_S
        while self._idle:
            parked_at, connection = self._idle.pop()
            if parked_at < fresh_since:
                # Closed, not reused: the engine may be closing it now. Those below are older.
                connection.close()
                self._close_idle()
                return None
            # One the engine closed while it waited is dropped here, before anything is sent.
            if connection.phase is Phase.IDLE and not connection.closing:
                return connection
        return None

    def _close_idle(self) -> None:
        idle, self._idle = self._idle, []
        for _, connection in idle:
            connection.close()

    async def _connect(self) -> EngineConnection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout_s):
            _, protocol = await loop.create_connection(
                lambda: EngineConnection(loop, self._read_timeout_s, self._engine_silence),
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self._ssl is not None else None,
            )
        return protocol

    @property
    def idle(self) -> int:
        """Kept-alive connections waiting for a request."""
        return len(self._idle)

    def put_back(self, connection: EngineConnection) -> None:
        """Keep ``connection`` for the next request if its answer allows; else close it."""
        # A kept connection keeps its timer: the next request's wait re-arms nothing.
        if self._closed or not connection.reusable or len(self._idle) >= MAX_IDLE:
            connection.close()
        else:
            connection.park()
            self._idle.append((self._clock(), connection))

    def close(self) -> None:
        self._closed = True
        self._close_idle()
