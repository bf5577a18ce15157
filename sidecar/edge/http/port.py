"""What every client connection of one listening port shares: its handler, bounds and budgets,
the count of refused connections still reading off, and the socket settings each connection
gets when it opens."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic

from sidecar.core.outcomes import EdgeFault
from sidecar.edge.http.connections import C, ConnectionTable
from sidecar.edge.http.limits import BodyBudget, EdgeLimits
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer

Handler = Callable[[Request], Awaitable[Answer]]

# How long a connection closed with its request body unread keeps reading it off.
LINGER_S = 1.0
# The bytes of an answer the kernel may hold unsent for a client (TCP_NOTSENT_LOWAT, where the
# platform has it). Without a bound Linux grows a socket's send buffer to tcp_wmem's maximum
# (4 MiB by default): a paced stream to a client that stopped reading then fills the kernel, not
# the transport, for minutes, and the write deadline never starts. With it, what a stalled client
# can leave unread is its own receive window, this, and the transport's high-water mark.
UNSENT_LIMIT = 16 * 1024
# Requests a connection runs ahead of its client's reads: each read before the answer before it
# had reached the client (left the sidecar, and acknowledged by the client's TCP). The one that
# reaches this depth gets the connection's last answer, so that of a client that pipelines and
# never reads, at most two requests reach the engine (RFC 9112 §9.3.2: it retries the rest).
MAX_AHEAD = 1
# Connections refused at the door that are still reading off what their client sent, so that it
# reads its 503 and not a reset: past this many the next one is closed at once.
MAX_LINGERING = 64


@dataclass(kw_only=True)
class Port(Generic[C]):
    """What every connection of one listening port shares."""

    handler: Handler
    limits: EdgeLimits
    max_body_bytes: int
    connections: ConnectionTable[C]
    bodies: BodyBudget
    # Every refusal and deadline of the door (a cap, a head too slow, a head not HTTP/1.1).
    refused: Callable[[EdgeFault], None] = lambda _fault: None
    lingering: int = 0  # its connections in the REFUSED state: reading off their client's bytes

    @property
    def max_head_bytes(self) -> int:
        """Head bytes past which a head that is still not complete is refused."""
        limits = self.limits
        return limits.max_line_size + limits.max_headers * (limits.max_field_size + 4)


def client_address(transport: asyncio.BaseTransport) -> str:
    """The peer's IP address; "" where it has none (a Unix socket)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


def tune_socket(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY, and TCP_NOTSENT_LOWAT where the platform has it, on a TCP connection.

    asyncio sets TCP_NODELAY only on sockets made with IPPROTO_TCP, which a listening socket's
    accepted ones are not: without it a head sent alone holds back the first event for the
    client's delayed ACK (40 ms)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hasattr(socket, "TCP_NOTSENT_LOWAT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_LIMIT)
