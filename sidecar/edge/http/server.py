"""The sidecar's HTTP/1.1 server side, for both ports: the listening socket, one
:class:`~sidecar.edge.http.connection.Connection` per client, and the shutdown.

Heads and bodies are parsed by llhttp, the C parser Node.js uses (through httptools), strictly:
both Content-Length and Transfer-Encoding, two Content-Lengths, a bad chunk size or a bare LF are
refused, never guessed at (request smuggling); RFC 9112's rules on the head beyond llhttp's are
sidecar.edge.conformance's. Around it, the edge's bounds:

- at most ``max_connections`` open connections, ``max_connections_per_client`` from one address,
  and ``max_partial_heads`` connections holding a request head open past a short grace; at a
  cap a stale partial head, then the longest idle connection, then a busy one that moves too
  little (its client slow to send or to read) is closed to make room
  (sidecar.edge.http.connections), and only where none is does the new one get a 503 it can read
  (what it sent is read off first, so that it is not a reset);
- every request head must be complete within ``header_timeout_s`` of its first byte (the first
  one: of the connection's start), else a 408; an idle kept-alive connection is closed after
  ``keepalive_timeout_s``;
- a request line, a field, the number of fields and the whole head are bounded;
- a malformed request gets an OpenAI-shaped JSON 400 that echoes nothing;
- one request at a time per connection: one pipelined request is parsed ahead (the rest of what
  was read waits unparsed, reading paused) and runs once the answer before it has left the
  transport's buffer; at most one runs ahead of the client's reads, its answer the connection's
  last; a client that hangs up cancels its handler at once.

The handler starts when the head is complete; the body is buffered into the :class:`Request` as
it arrives, and the bodies a port holds at once stay within ``max_buffered_body_bytes``, those of
one client address within ``max_buffered_body_bytes_per_client``. Every refusal and deadline at
the door is reported to ``refused`` (the metrics and a log line per burst). A
connection that closes with a body still unread half-closes first and reads off what the client
still sends for a second, so the client reads its answer, not a reset.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

from sidecar.core.outcomes import EdgeFault
from sidecar.edge.http.connection import Connection
from sidecar.edge.http.connections import ConnectionTable
from sidecar.edge.http.limits import BodyBudget, EdgeLimits
from sidecar.edge.http.port import Handler, Port

__all__ = ["Handler", "HttpServer"]


class HttpServer:
    """The listening side: every connection's :class:`Connection`, and the shutdown."""

    def __init__(
        self,
        handler: Handler,
        limits: EdgeLimits,
        *,
        max_body_bytes: int,
        refused: Callable[[EdgeFault], None] = lambda _fault: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.connections: ConnectionTable[Connection] = ConnectionTable(
            limits.max_connections,
            limits.max_connections_per_client,
            limits.max_partial_heads,
            clock=clock,
        )
        self.count = self.connections.count
        self.bodies = BodyBudget(
            limits.max_buffered_body_bytes, limits.max_buffered_body_bytes_per_client, clock=clock
        )
        self._port: Port[Connection] = Port(
            handler=handler,
            limits=limits,
            max_body_bytes=max_body_bytes,
            connections=self.connections,
            bodies=self.bodies,
            refused=refused,
        )
        self._server: asyncio.Server | None = None

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        port = self._port
        self._server = await loop.create_server(lambda: Connection(port), sock=sock, backlog=1024)

    async def close(self, timeout_s: float) -> None:
        """Stop listening, close idle connections (a running request's answer is its
        connection's last), give running handlers ``timeout_s``, then end the rest (their
        handlers cancelled)."""
        if self._server is not None:
            self._server.close()
        for connection in self.connections:
            connection.shut_down()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for connection in self.connections:
            if connection.task is None:
                connection.close_if_idle()
            else:
                connection.abort()
        await asyncio.sleep(0)  # their connection_lost callbacks
        if self._server is not None:
            await self._server.wait_closed()
