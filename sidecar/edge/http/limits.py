"""The bounded edge, in plain values: the bounds of a port (its connection cap, deadlines and
head sizes, enforced by sidecar.edge.http.server), the pace a request body must keep, the answers
given at the door, and the cap on the work done before admission."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Literal, Protocol

from sidecar.core.errors import EdgeRefusedError
from sidecar.core.outcomes import EDGE_FAULTS, EdgeFault, refusal_body

# The body budget's refusals (rows of EDGE_FAULTS): the port's, or one address's share.
BudgetFault = Literal["body_budget_full", "client_body_budget_full"]


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """The edge's bounds, in plain values (built from the settings in the entry layer)."""

    max_connections: int = 4096
    max_connections_per_client: int = 2048
    max_partial_heads: int = 128
    max_buffered_body_bytes: int = 128 * 1024 * 1024
    max_buffered_body_bytes_per_client: int = 32 * 1024 * 1024
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 15.0
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 64


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """How long a request body may take: ``timeout_s`` in all, and never less than ``min_rate``
    bytes a second over the last ``grace_s`` (0: no floor). The floor is what keeps a client from
    holding a connection with a trickle (Apache's mod_reqtimeout has the same pair: a timeout and
    a MinRate). It is the recent pace, over a window that slides by half its length, not the
    average since the start: a fast start cannot buy a stall that lasts until the timeout."""

    timeout_s: float = 30.0
    min_rate: int = 500
    grace_s: float = 5.0

    def first_check(self, started: float) -> BodyPace:
        """The pace to keep for a body that began at ``started``: first checked after the
        grace (a whole window), then every half window."""
        return BodyPace(((started, 0),), self._next(started, started + self.grace_s))

    def check(self, pace: BodyPace, started: float, now: float, received: int) -> BodyPace | None:
        """At ``pace.check_at``: the pace to keep next, or None where the body is too late or
        received less than the floor over the window that ends now."""
        if now >= started + self.timeout_s:
            return None
        window_start = now - self.grace_s
        # The window's base: the last mark at or before its start (the body's start at first).
        base = next((m for m in reversed(pace.marks) if m[0] <= window_start), pace.marks[0])
        since, then = base
        if self.min_rate > 0 and received - then < self.min_rate * (now - since):
            return None
        marks = (*(m for m in pace.marks if m[0] >= since), (now, received))
        return BodyPace(marks, self._next(started, now + self.grace_s / 2))

    def _next(self, started: float, at: float) -> float:
        deadline = started + self.timeout_s
        return deadline if self.min_rate <= 0 else min(deadline, at)


@dataclass(frozen=True, slots=True)
class BodyPace:
    """A body's pace so far: (time, bytes received) at each check of the last window, oldest
    first, and when it is checked next."""

    marks: tuple[tuple[float, int], ...]
    check_at: float


class Stallable(Protocol):
    """A body still arriving, as the budget sees it."""

    def stall(self) -> None:
        """End this body: it sent nothing for a while and its room is needed."""


class BodyBudget:
    """Request body bytes held at once by one port, whatever the number of connections, and by
    any one client address (``per_client``).

    A body is awaited outside the pre-admission gate, so without this the memory that bodies
    hold would be bounded only by the connections times the body limit. A body whose next bytes
    do not fit is refused (503); its bytes come back when its request ends. The share per
    address keeps a few connections from one address from holding the whole budget, and a body
    that has sent nothing for ``grace_s`` gives its room up to one that is arriving (the
    longest silent first), so bodies that stall cannot hold the budget from many addresses
    either."""

    def __init__(
        self,
        limit: int,
        per_client: int | None = None,
        *,
        grace_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.per_client = limit if per_client is None else per_client
        self.grace_s, self._clock = grace_s, clock
        self.held = 0
        self.refused = 0
        self._held_by: dict[str, int] = {}
        self._arriving: dict[Stallable, float] = {}  # by their last bytes' time, oldest first

    def take(
        self, size: int, client: str = "", body: Stallable | None = None
    ) -> BudgetFault | None:
        """Charge ``size`` bytes of ``body`` to ``client``; or the fault that refuses them."""
        now = self._clock()
        if body is not None:
            self._arriving.pop(body, None)  # back at the end once charged: the newest bytes
        mine = self._held_by.get(client, 0)
        if mine + size > self.per_client:
            self.refused += 1
            return "client_body_budget_full"
        while self.held + size > self.limit:
            if not self._stall_one(now):
                self.refused += 1
                return "body_budget_full"
        self.held += size
        self._held_by[client] = self._held_by.get(client, 0) + size
        if body is not None:
            self._arriving[body] = now
        return None

    def arrived(self, body: Stallable) -> None:
        """``body`` is whole, or ended: it is no longer one that may stall."""
        self._arriving.pop(body, None)

    def give(self, size: int, client: str = "") -> None:
        if size <= 0:
            return
        self.held -= size
        left = self._held_by.get(client, 0) - size
        if left > 0:
            self._held_by[client] = left
        else:
            self._held_by.pop(client, None)

    def _stall_one(self, now: float) -> bool:
        """End the body silent the longest, if it has been for ``grace_s``; False if none."""
        oldest = next(iter(self._arriving.items()), None)
        if oldest is None or oldest[1] > now - self.grace_s:
            return False
        del self._arriving[oldest[0]]
        oldest[0].stall()  # which gives its bytes back
        return True


@dataclass(slots=True)
class ConnectionCount:
    """Open client connections of one listening port."""

    open: int = 0
    refused: int = 0
    evicted: int = 0  # partial heads and idle ones closed to make room for a new one
    head_timeouts: int = 0


def raw_answer(fault: EdgeFault, message: str | None = None) -> bytes:
    """A complete HTTP/1.1 answer for ``fault``: OpenAI-shaped JSON, then the connection closes.

    ``message`` (our own words, never the client's bytes) says more than the fault's own."""
    refusal = EDGE_FAULTS[fault]
    body = json.dumps(refusal_body(refusal, message)).encode()
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
