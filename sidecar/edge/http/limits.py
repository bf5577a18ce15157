"""The bounded edge, in plain values: the bounds of a port (its connection cap, deadlines and
head sizes, enforced by sidecar.edge.http.server), the buffer request bodies share, and the count
of connections (the answers given at the door are :func:`sidecar.edge.message.raw_answer`'s)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from sidecar.core.admission.room_hint import RoomHint

# The body budget's refusals (rows of EDGE_FAULTS): the port's, or one address's share.
BudgetFault = Literal["body_budget_full", "client_body_budget_full"]


@dataclass(frozen=True, slots=True, kw_only=True)
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
        self._room = RoomHint(clock())  # when a body gives its bytes back

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
        self._room.freed(self._clock())

    def room_s(self) -> float:
        """Seconds until a body is expected to give its bytes back (a refusal's Retry-After):
        the port's measured pace, for a client at its own share too."""
        return self._room.wait_s(self._clock())

    def _stall_one(self, now: float) -> bool:
        """End the body silent the longest, if it has been for ``grace_s``; False if none."""
        oldest = next(iter(self._arriving.items()), None)
        if oldest is None or oldest[1] > now - self.grace_s:
            return False
        del self._arriving[oldest[0]]
        oldest[0].stall()  # which gives its bytes back
        return True


@dataclass(slots=True, kw_only=True)
class ConnectionCount:
    """Open client connections of one listening port."""

    open: int = 0
    refused: int = 0
    evicted: int = 0  # connections closed to make room for a new one
    evicted_busy: int = 0  # of them, busy ones that moved too little
    head_timeouts: int = 0
    rests: int = 0  # reads under the read floor, each followed by a rest of its connection
