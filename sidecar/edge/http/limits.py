"""The bounded edge, in plain values: the bounds of a port (its connection cap, deadlines and
head sizes, enforced by sidecar.edge.http.server), the pace a request body must keep, the answers
given at the door, and the cap on the work done before admission."""

from __future__ import annotations

import json
from dataclasses import dataclass
from http import HTTPStatus

from sidecar.core.errors import EdgeRefusedError
from sidecar.core.outcomes import EDGE_FAULTS, EdgeFault


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """The edge's bounds, in plain values (built from the settings in the entry layer)."""

    max_connections: int = 512
    max_connections_per_client: int = 256
    max_buffered_body_bytes: int = 128 * 1024 * 1024
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 15.0
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 64


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """How long a request body may take: ``timeout_s`` in all, and after ``grace_s`` never less
    than ``min_rate`` bytes a second on average since it began (0: no floor). The floor is what
    keeps a client from holding a connection with a trickle (Apache's mod_reqtimeout has the same
    pair: a timeout and a MinRate)."""

    timeout_s: float = 30.0
    min_rate: int = 500
    grace_s: float = 5.0

    def check_at(self, started: float, received: int) -> float:
        """When a body that began at ``started`` falls under the floor with ``received`` bytes,
        if no more come; the overall deadline where there is no floor."""
        deadline = started + self.timeout_s
        if self.min_rate <= 0:
            return deadline
        return min(deadline, started + max(self.grace_s, received / self.min_rate))


class BodyBudget:
    """Request body bytes held at once by one port, whatever the number of connections.

    A body is awaited outside the pre-admission gate, so without this the memory that bodies
    hold would be bounded only by the connections times the body limit. A body whose next bytes
    do not fit is refused (503 ``edge_busy``); its bytes come back when its request ends."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.refused = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            self.refused += 1
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


@dataclass(slots=True)
class ConnectionCount:
    """Open client connections of one listening port."""

    open: int = 0
    refused: int = 0
    evicted: int = 0  # idle ones closed to make room for a new one
    head_timeouts: int = 0


def raw_answer(fault: EdgeFault, message: str | None = None) -> bytes:
    """A complete HTTP/1.1 answer for ``fault``: OpenAI-shaped JSON, then the connection closes.

    ``message`` (our own words, never the client's bytes) says more than the fault's own."""
    refusal = EDGE_FAULTS[fault]
    error = {
        "message": message or refusal.message,
        "type": refusal.error_type,
        "param": None,
        "code": refusal.code,
    }
    body = json.dumps({"error": error}).encode()
    retry = b"Retry-After: 1\r\n" if refusal.status == 503 else b""
    head = (
        f"HTTP/1.1 {refusal.status} {HTTPStatus(refusal.status).phrase}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode()
    return head + retry + b"\r\n" + body


class Gate:
    """At most ``limit`` requests being parsed, checked or counted at once (``with gate:``); the
    next one is refused at once (503 ``edge_busy``), never queued."""

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
