"""The open connections of one listening port: how many in all and per client address, and which
are idle, longest idle first, so that the port makes room by closing an idle one before it turns
a new client away (nginx reuses its idle connections the same way when it runs out of them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from sidecar.core.outcomes import EdgeFault
from sidecar.edge.http.limits import ConnectionCount


class Evictable(Protocol):
    def evict(self) -> None:
        """Close an idle connection to make room for a new one."""


C = TypeVar("C", bound=Evictable)


class ConnectionTable(Generic[C]):
    """At most ``max_total`` connections, and ``max_per_client`` from any one address."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        self.max_total, self.max_per_client = max_total, max_per_client
        self.count = ConnectionCount()
        self._client_of: dict[C, str] = {}
        self._per_client: Counter[str] = Counter()
        self._idle: dict[C, None] = {}  # insertion order: the longest idle first

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._client_of))

    def open(self, connection: C, client: str) -> EdgeFault | None:
        """Count ``connection`` in (idle: it has sent nothing yet); or the fault that refuses it.

        At a cap, the longest idle connection that counts against it is closed to make room: the
        client's own at the client's cap, anyone's at the port's. Only where none is idle is the
        new one refused."""
        if self._per_client[client] >= self.max_per_client and not self._evict_one(client):
            self.count.refused += 1
            return "too_many_client_connections"
        if len(self._client_of) >= self.max_total and not self._evict_one(None):
            self.count.refused += 1
            return "too_many_connections"
        self._client_of[connection] = client
        self._per_client[client] += 1
        self.count.open += 1
        self._idle[connection] = None
        return None

    def close(self, connection: C) -> None:
        """Count ``connection`` out; a second call does nothing."""
        client = self._client_of.pop(connection, None)
        if client is None:
            return
        self._idle.pop(connection, None)
        self._per_client[client] -= 1
        if self._per_client[client] == 0:
            del self._per_client[client]
        self.count.open -= 1

    def set_idle(self, connection: C, *, idle: bool) -> None:
        """Mark ``connection`` idle (waiting for a request's first byte) or busy."""
        if not idle:
            self._idle.pop(connection, None)
        elif connection in self._client_of:
            self._idle.pop(connection, None)  # idle again: the newest idle
            self._idle[connection] = None

    def _evict_one(self, client: str | None) -> bool:
        """Close the longest idle connection (``client``'s own, if given); False if none is."""
        victim = next(
            (c for c in self._idle if client is None or self._client_of[c] == client), None
        )
        if victim is None:
            return False
        self.close(victim)
        self.count.evicted += 1
        victim.evict()
        return True
