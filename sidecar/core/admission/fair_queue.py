"""One compartment's waiters in the order they are granted: the source holding fewest places first.

A waiter's source is who sent it (:meth:`sidecar.limiter.bulkhead.Bulkhead.admit` says what:
a tenant, else a client address); None is one shared anonymous source. Its *rank* is the places
its source holds in the compartment plus its source's waiters older than it; the lowest rank is
granted first, the oldest first among equals. Granting a waiter raises its source's places by one
as it leaves its source's waiters, so a waiter's rank never rises while it waits, and the grant
order is the rank order (a merge of each source's ranks). With one source, the rank order is
first come, first served.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True, eq=False)  # by identity: a deque's remove() then never calls __eq__
class Waiter:
    """A request in the admission core: queued, then granted; ``source``: who sent it."""

    ticket: int
    compartment: str
    cost: int
    source: str | None = None


class FairQueue:
    """A compartment's waiters, each source's in ticket order, and the places each source holds.

    ``head`` is O(1) while one source waits (no sources given: every waiter is the anonymous
    one's) and O(sources waiting) otherwise; the counts of waiters ahead are O(sources waiting)
    and the whole order O(waiters log waiters). The queue is bounded (``SIDECAR_MAX_QUEUE``).
    """

    def __init__(self) -> None:
        self._waiting: dict[str | None, deque[Waiter]] = {}
        self._held: Counter[str | None] = Counter()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Waiter]:
        """Every waiter, each source's in ticket order."""
        return itertools.chain.from_iterable(self._waiting.values())

    def append(self, waiter: Waiter) -> None:
        self._waiting.setdefault(waiter.source, deque()).append(waiter)
        self._size += 1

    def remove(self, waiter: Waiter) -> None:
        queue = self._waiting[waiter.source]
        queue.remove(waiter)
        if not queue:
            del self._waiting[waiter.source]
        self._size -= 1

    def hold(self, source: str | None) -> None:
        """A request of ``source`` was granted a place in this compartment."""
        self._held[source] += 1

    def free(self, source: str | None) -> None:
        """A place that a request of ``source`` held in this compartment was released."""
        self._held[source] -= 1
        if not self._held[source]:
            del self._held[source]

    def head(self) -> Waiter:
        """The waiter to be granted next: its source holds the fewest places (the oldest among
        equals). The queue must not be empty."""
        if len(self._waiting) == 1:
            return next(iter(self._waiting.values()))[0]
        return min((q[0] for q in self._waiting.values()), key=self._rank)

    def oldest(self) -> int:
        """The ticket of the waiter queued longest (the queue must not be empty)."""
        return min(q[0].ticket for q in self._waiting.values())

    def order(self) -> list[Waiter]:
        """Every waiter, in the order they are to be granted as things stand."""
        ranked = (
            (self._held[source] + older, waiter.ticket, waiter)
            for source, queue in self._waiting.items()
            for older, waiter in enumerate(queue)
        )
        return [waiter for _, _, waiter in sorted(ranked, key=lambda r: r[:2])]

    def ahead_of(self, waiter: Waiter) -> int:
        """How many waiters are to be granted before ``waiter`` (queued here) as things stand."""
        level = self._held[waiter.source] + self._waiting[waiter.source].index(waiter)
        return self._ranked_before(level, waiter.ticket)

    def ahead_of_newcomer(self, source: str | None) -> int:
        """How many waiters would be granted before a request of ``source`` queued now."""
        return self._ranked_before(self._held[source] + len(self._waiting.get(source, ())), None)

    def _rank(self, waiter: Waiter) -> tuple[int, int]:
        """The rank of the first waiter of its source."""
        return self._held[waiter.source], waiter.ticket

    def _ranked_before(self, level: int, ticket: int | None) -> int:
        """The waiters ranked before (``level``, ``ticket``); ``ticket`` None: the youngest."""
        ahead = 0
        for source, queue in self._waiting.items():
            held = self._held[source]
            below = min(len(queue), max(0, level - held))  # this source's ranks under ``level``
            if below < len(queue) and held + below == level:
                tied = queue[below].ticket
                below += ticket is None or tied < ticket  # one of equal rank, if it is older
            ahead += below
        return ahead
