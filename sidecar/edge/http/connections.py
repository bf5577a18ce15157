"""The open connections of one listening port: how many in all and per client address, and which
the port may close to make room for a new one before it turns the new one away.

A connection is always one of three kinds, for this table:

- **partial**: no request running and its next head not complete (a new connection that has sent
  nothing yet, or one a byte or two into a head). A head costs its sender nothing to hold open
  until the header deadline, so partial heads have a budget of their own (``max_partial``), and
  one partial for longer than ``grace_s`` is the first to be closed at any cap, oldest first.
  Within ``grace_s`` a partial head is left alone (a client that just connected is sending it),
  except at the port's cap when no stale head or idle connection is left: then the address that
  holds the most partial heads gives up its oldest, where it holds more than the newcomer's would
  (a flood that reconnects at once keeps its heads young; it cannot keep them from being the most).
- **idle**: kept alive between requests; closed to make room once no stale partial head is left,
  longest idle first (nginx reuses its idle connections the same way when it runs out of them).
- **busy**: a request is running; never closed to make room.

The per-address cap is a share, not a wall against the address: a client at its cap makes room
from its own partial heads and idle connections first, so a flood of heads from an address that
legitimate traffic shares (a gateway's) closes its own heads, not the gateway's next request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Generic, Literal, Protocol, TypeVar

from sidecar.core.admission.room_hint import RoomHint
from sidecar.core.outcomes import EdgeFault
from sidecar.edge.http.limits import ConnectionCount

Kind = Literal["partial", "idle", "busy"]


class Evictable(Protocol):
    def evict(self, fault: EdgeFault | None) -> None:
        """Close this connection to make room for a new one: a partial head is answered with
        ``fault``'s refusal, an idle connection (``None``) just closed."""


C = TypeVar("C", bound=Evictable)


class ConnectionTable(Generic[C]):
    """At most ``max_total`` connections, ``max_per_client`` from any one address, and
    ``max_partial`` partial heads past their ``grace_s``."""

    def __init__(
        self,
        max_total: int,
        max_per_client: int,
        max_partial: int,
        *,
        grace_s: float = 1.0,
        clock: Callable[[], float],
    ) -> None:
        self.max_total, self.max_per_client = max_total, max_per_client
        self.max_partial = max_partial
        self.grace_s, self._clock = grace_s, clock
        self.count = ConnectionCount()
        self._client_of: dict[C, str] = {}
        self._per_client: Counter[str] = Counter()
        self._partial: dict[C, float] = {}  # since when; insertion order: the oldest first
        self._idle: dict[C, None] = {}  # insertion order: the longest idle first
        self._partial_by: Counter[str] = Counter()  # partial heads per address
        self._room = RoomHint(clock())  # when a connection goes, for a refusal's Retry-After

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._client_of))

    def open(self, connection: C, client: str) -> EdgeFault | None:
        """Count ``connection`` in (partial: it has sent nothing yet); or the fault that refuses
        it. At a cap a stale partial head, then an idle connection, is closed to make room: the
        client's own at the client's cap, anyone's at the port's."""
        if self._per_client[client] >= self.max_per_client and not self._evict_one(client):
            self.count.refused += 1
            return "too_many_client_connections"
        if len(self._client_of) >= self.max_total and not (
            self._evict_one(None) or self._evict_from_top_holder(client)
        ):
            self.count.refused += 1
            return "too_many_connections"
        if len(self._partial) >= self.max_partial:
            self._evict_stale_partial(None)  # none stale: it waits its grace, within the caps
        self._client_of[connection] = client
        self._per_client[client] += 1
        self.count.open += 1
        self._partial[connection] = self._clock()
        self._partial_by[client] += 1
        return None

    def close(self, connection: C) -> None:
        """Count ``connection`` out; a second call does nothing."""
        client = self._client_of.pop(connection, None)
        if client is None:
            return
        self._idle.pop(connection, None)
        self._unpartial(connection, client)
        self._per_client[client] -= 1
        if self._per_client[client] == 0:
            del self._per_client[client]
        self.count.open -= 1
        self._room.freed(self._clock())

    def room_s(self) -> float:
        """Seconds until a connection is expected to go (a refusal's Retry-After): the port's
        measured pace, for a client at its own share too."""
        return self._room.wait_s(self._clock())

    def mark(self, connection: C, kind: Kind) -> None:
        """``connection`` is now ``kind``: partial (a head begun), idle or busy."""
        if connection not in self._client_of:
            return
        client = self._client_of[connection]
        self._idle.pop(connection, None)
        if kind != "partial":
            self._unpartial(connection, client)
        if kind == "idle":
            self._idle[connection] = None  # idle again: the newest idle
        elif kind == "partial" and connection not in self._partial:
            self._partial[connection] = self._clock()
            self._partial_by[client] += 1

    def _unpartial(self, connection: C, client: str) -> None:
        if self._partial.pop(connection, None) is not None:
            self._partial_by[client] -= 1
            if self._partial_by[client] == 0:
                del self._partial_by[client]

    @property
    def partial(self) -> int:
        return len(self._partial)

    def _evict_one(self, client: str | None) -> bool:
        """Close a stale partial head, else the longest idle connection (``client``'s own, if
        given); False if there is neither."""
        if self._evict_stale_partial(client):
            return True
        victim = next((c for c in self._idle if self._belongs(c, client)), None)
        if victim is None:
            return False
        self._evict(victim, None)
        return True

    def _evict_stale_partial(self, client: str | None) -> bool:
        stale_before = self._clock() - self.grace_s
        for connection, since in self._partial.items():
            if since > stale_before:
                return False  # the oldest first: no later one is stale either
            if self._belongs(connection, client):
                self._evict(connection, "too_many_partial_heads")
                return True
        return False

    def _evict_from_top_holder(self, newcomer: str) -> bool:
        """Close the oldest partial head of the address holding the most, unless that address
        would hold no more than the newcomer's with it (its own, or a tie: closing a head for an
        equal would be a refusal by another name); False if none is closed."""
        if not self._partial_by:
            return False
        top, held = self._partial_by.most_common(1)[0]
        if held <= self._partial_by[newcomer] + 1:  # its own, or no more than it would hold
            return False
        victim = next(c for c in self._partial if self._client_of[c] == top)
        self._evict(victim, "too_many_partial_heads")
        return True

    def _belongs(self, connection: C, client: str | None) -> bool:
        return client is None or self._client_of[connection] == client

    def _evict(self, victim: C, fault: EdgeFault | None) -> None:
        self.close(victim)
        self.count.evicted += 1
        victim.evict(fault)
