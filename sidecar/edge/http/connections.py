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
- **busy**: a request is running. Closed to make room only when it waits on its client (a body
  still arriving, or an answer its client does not read) and has been busy past ``grace_s``: the
  slowest (fewest bytes moved a second since it turned busy) of the oldest ``SCAN_BUSY`` such of
  the address holding the most connections, where that address holds more than the newcomer's
  would; a client at its own cap, its own. A body is ended as too slow (408), a reader that does
  not read is cut off. One that moves its bytes at the pace its client sets is never closed.

The per-address cap is a share, not a wall against the address: a client at its cap makes room
from its own partial heads and idle connections first, so a flood of heads from an address that
legitimate traffic shares (a gateway's) closes its own heads, not the gateway's next request. And
no number of addresses can fill the port with connections that move too little: a newcomer from
an address holding fewer takes the room of the slowest of the address holding most.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Generic, Literal, Protocol, TypeVar

from sidecar.core.admission.room_hint import RoomHint
from sidecar.core.outcomes import EdgeFault
from sidecar.edge.http.limits import ConnectionCount

Kind = Literal["partial", "idle", "busy"]
# The oldest busy connections of an address looked at for the slowest: a bound on the work one
# new connection can cause at a full port.
SCAN_BUSY = 64


class Evictable(Protocol):
    def evict(self, fault: EdgeFault | None) -> None:
        """Close this connection to make room for a new one: a partial head is answered with
        ``fault``'s refusal, an idle connection (``None``) just closed, a busy one that waits on
        its client ended (its body as too slow, a stalled answer cut off)."""

    def waiting_on_client(self) -> int | None:
        """Bytes its running request has moved (its body received), where it waits on its
        client: a body still arriving, or an answer its client does not read (writing paused);
        None where it does not."""

    def held_bytes(self) -> int:
        """Bytes this connection holds in the process: read and not parsed, body received,
        answer not yet written to the socket."""


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
        self.accepting = True  # False while the overload manager says stop
        self._client_of: dict[C, str] = {}
        self._per_client: Counter[str] = Counter()
        self._partial: dict[C, float] = {}  # since when; insertion order: the oldest first
        self._idle: dict[C, None] = {}  # insertion order: the longest idle first
        self._busy: dict[str, dict[C, float]] = {}  # per address, since when; the oldest first
        self._partial_by: Counter[str] = Counter()  # partial heads per address
        self._room = RoomHint(clock())  # when a connection goes, for a refusal's Retry-After

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._client_of))

    def open(self, connection: C, client: str) -> EdgeFault | None:
        """Count ``connection`` in (partial: it has sent nothing yet); or the fault that refuses
        it. At a cap a stale partial head, then an idle connection, is closed to make room: the
        client's own at the client's cap, anyone's at the port's. While the port is not
        accepting (overloaded), every new one is refused."""
        if not self.accepting:
            self.count.refused += 1
            return "too_many_connections"
        if self._per_client[client] >= self.max_per_client and not (
            self._evict_one(client) or self._evict_slowest_busy(client)
        ):
            self.count.refused += 1
            return "too_many_client_connections"
        if len(self._client_of) >= self.max_total and not (
            self._evict_one(None)
            or self._evict_from_top_holder(client)
            or self._evict_slow_from_top_holder(client)
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
        self._unbusy(connection, client)
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
        if kind != "busy":
            self._unbusy(connection, client)
        elif connection not in self._busy.setdefault(client, {}):
            self._busy[client][connection] = self._clock()
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

    def _unbusy(self, connection: C, client: str) -> None:
        busy = self._busy.get(client)
        if busy is not None and busy.pop(connection, None) is not None and not busy:
            del self._busy[client]

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

    def _evict_slow_from_top_holder(self, newcomer: str) -> bool:
        """Close the slowest busy connection waiting on its client of the address holding the
        most connections, unless that address would hold no more than the newcomer's with it."""
        top, held = max(self._per_client.items(), key=lambda item: item[1])
        if held <= self._per_client[newcomer] + 1:
            return False
        return self._evict_slowest_busy(top)

    def _evict_slowest_busy(self, client: str) -> bool:
        """Close the slowest of ``client``'s oldest ``SCAN_BUSY`` busy connections that wait on
        their client, busy for ``grace_s`` at least; False if none is."""
        now = self._clock()
        slowest: tuple[float, C] | None = None
        oldest = itertools.islice(self._busy.get(client, {}).items(), SCAN_BUSY)
        for connection, since in oldest:
            if since > now - self.grace_s:
                break  # the oldest first: none later is past its grace either
            moved = connection.waiting_on_client()
            if moved is not None and (slowest is None or moved / (now - since) < slowest[0]):
                slowest = (moved / (now - since), connection)
        if slowest is None:
            return False
        self.count.evicted_busy += 1
        self._evict(slowest[1], None)
        return True

    def shed(self, share: float, at_least: int = 0) -> int:
        """Close ``share`` of the connections doing the least (a partial head, an idle one, a
        busy one waiting on its client past ``grace_s``: a fast answer pauses for a moment too),
        at least ``at_least``, those holding the most bytes first; how many."""
        idle = [c for c in self._client_of if c in self._partial or c in self._idle]
        settled = self._clock() - self.grace_s
        waiting = [
            c
            for busy in self._busy.values()
            for c, since in busy.items()
            if since <= settled and c.waiting_on_client() is not None
        ]
        count = max(at_least, math.ceil(share * (len(idle) + len(waiting))))
        victims = sorted(idle + waiting, key=lambda c: c.held_bytes(), reverse=True)[:count]
        for victim in victims:
            self._evict(victim, "too_many_connections" if victim in self._partial else None)
        return len(victims)

    def _belongs(self, connection: C, client: str | None) -> bool:
        return client is None or self._client_of[connection] == client

    def _evict(self, victim: C, fault: EdgeFault | None) -> None:
        self.close(victim)
        self.count.evicted += 1
        victim.evict(fault)
