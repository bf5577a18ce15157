"""Queued waiters' deadlines behind one loop timer: (deadline, ticket) in deadline order, pruned
lazily.

A timer handle per waiter costs its creation, a cancel on every grant and the loop's heap of
handles compared in Python; here a grant only forgets its ticket, and only the earliest deadline
holds a timer. Expiring stays a callback the bulkhead checks against the core, as before.

Every waiter of a bulkhead waits as long, so deadlines come in the order they are added: each
goes on the end of a deque and grants, oldest first where one source waits, take them off the
front, no heap needed. One that comes earlier than the last (a shorter delay) is put in its
place.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[], None]], TimerHandle]

# Out-of-order leavers (another compartment's or source's grant, a cancel) stay in the deque
# until this many more than the live entries pile up; then one rebuild, so it is O(live)
# amortised.
_SLACK = 64


class Expiry:
    """Calls ``expire(ticket)`` once a ticket's deadline passes, unless it was discarded first."""

    def __init__(
        self, *, now: Callable[[], float], call_later: CallLater, expire: Callable[[int], None]
    ) -> None:
        self._now, self._call_later, self._expire = now, call_later, expire
        self._order: deque[tuple[float, int]] = deque()
        self._live: set[int] = set()
        self._timer: TimerHandle | None = None
        self._armed_for = math.inf

    def __len__(self) -> int:
        return len(self._live)

    @property
    def held(self) -> int:
        """Entries kept, live or forgotten: at most ``2 * len(self) + 64``."""
        return len(self._order)

    def add(self, ticket: int, delay: float) -> None:
        """Expire ``ticket`` ``delay`` seconds from now."""
        deadline = self._now() + delay
        self._live.add(ticket)
        order = self._order
        if not order or deadline >= order[-1][0]:
            order.append((deadline, ticket))
        else:
            bisect.insort(order, (deadline, ticket))
        if deadline < self._armed_for:
            self._arm(deadline, delay)

    def discard(self, ticket: int) -> None:
        """Forget ``ticket`` (granted, refused or gone); unknown tickets are ignored."""
        live = self._live
        if ticket not in live:
            return  # forgotten already (a grant, then the waiter's own unwind)
        live.remove(ticket)
        order = self._order
        while order and order[0][1] not in live:
            order.popleft()  # a FIFO grant, and any forgotten before it: O(1) each, no rebuild
        if len(order) > 2 * len(live) + _SLACK:
            self._order = deque(entry for entry in order if entry[1] in live)

    def _arm(self, deadline: float, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = deadline
        self._timer = self._call_later(max(delay, 0.0), self._fire)

    def _fire(self) -> None:
        self._timer, self._armed_for = None, math.inf
        now = self._now()
        while (ticket := self._pop_due(now)) is not None:
            self._expire(ticket)  # may discard or add others (and rebuild the deque)
        # The top may be live and not yet due (an early or a stale timer): arm for it.
        if self._order and self._order[0][0] < self._armed_for:
            self._arm(self._order[0][0], self._order[0][0] - now)

    def _pop_due(self, now: float) -> int | None:
        """The next live ticket due by ``now``, taken out; forgotten entries on top are dropped."""
        order = self._order
        while order and (order[0][1] not in self._live or order[0][0] <= now):
            _, ticket = order.popleft()
            if ticket in self._live:
                self._live.discard(ticket)
                return ticket
        return None
