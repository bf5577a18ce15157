"""A client connection's life as one table: (state, event) -> next state, as h11 keeps it.

Pure: no I/O. A connection's :class:`~sidecar.edge.http.life.Life` moves only through
:func:`next_state`; a pair the table lacks is a bug, raised as ``IllegalTransitionError``. Whether
an answer keeps the connection is read from the state (ACTIVE), as is whether a closing connection
reads off its client's bytes (LINGERING, REFUSED) and is one of the port's refused ones (REFUSED).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from sidecar.core.errors import IllegalTransitionError


class State(enum.Enum):
    """Where a client connection is."""

    IDLE = "idle"  # no request is being handled; the next one's head may be arriving
    ACTIVE = "active"  # a request is being handled, the connection kept after its answer
    CLOSE_AFTER = "close_after"  # a request is being handled and the connection closes after its
    # answer; its body (and one pipelined behind it) is still read
    LAST = "last"  # a request is being handled and its answer is the last: no more is parsed
    CLOSING = "closing"  # no request will be handled: what arrives is dropped until the close
    LINGERING = "lingering"  # closing, half-closed: what its client still sends is read off and
    # dropped for a moment, so that it reads its answer, not a reset
    REFUSED = "refused"  # refused at the door (a 503 it can read), lingering as above: one of
    # the port's ``lingering`` connections
    CLOSED = "closed"  # the transport is gone


class Event(enum.Enum):
    """What moves a client connection."""

    START = "start"  # a request's handler starts
    NO_KEEP_ALIVE = "no_keep_alive"  # the request under way may not be followed by another: its
    # client asked to close, its body was not read whole, or the port is shutting down
    FINAL = "final"  # nothing more can be parsed (an upgrade, broken framing): the answer
    # under way, or the next one, is the last
    KEEP = "keep"  # an answer went out whole and the connection is kept for the next request
    CLOSE = "close"  # closed, or closing once the answer is out: no request will be handled
    LINGER = "linger"  # closing with bytes of its client's unread: half-closed, read off first
    REFUSE = "refuse"  # refused at the door, or closed to make room for a new connection
    LOST = "lost"  # the transport is gone


# Connections that are read from: what arrives in the others is dropped.
READING = frozenset({State.IDLE, State.ACTIVE, State.CLOSE_AFTER})

TRANSITIONS: Mapping[tuple[State, Event], State] = MappingProxyType({
    (State.IDLE, Event.START): State.ACTIVE,
    # A request queued behind one whose framing broke starts, and its answer is the last.
    (State.LAST, Event.START): State.LAST,
    (State.ACTIVE, Event.NO_KEEP_ALIVE): State.CLOSE_AFTER,
    # Broken framing while a queued request waits for the client to read the answer before it.
    (State.IDLE, Event.FINAL): State.LAST,
    (State.ACTIVE, Event.FINAL): State.LAST,
    (State.CLOSE_AFTER, Event.FINAL): State.LAST,
    (State.LAST, Event.FINAL): State.LAST,
    (State.ACTIVE, Event.KEEP): State.IDLE,
    (State.IDLE, Event.CLOSE): State.CLOSING,
    (State.ACTIVE, Event.CLOSE): State.CLOSING,
    (State.CLOSE_AFTER, Event.CLOSE): State.CLOSING,
    (State.LAST, Event.CLOSE): State.CLOSING,
    (State.CLOSING, Event.CLOSE): State.CLOSING,
    (State.LINGERING, Event.CLOSE): State.CLOSING,
    (State.IDLE, Event.LINGER): State.LINGERING,
    (State.ACTIVE, Event.LINGER): State.LINGERING,
    (State.CLOSE_AFTER, Event.LINGER): State.LINGERING,
    (State.LAST, Event.LINGER): State.LINGERING,
    # A partial head closed to make room; one whose broken head was answered may be too.
    (State.IDLE, Event.REFUSE): State.REFUSED,
    (State.CLOSING, Event.REFUSE): State.REFUSED,
    (State.LINGERING, Event.REFUSE): State.REFUSED,
    (State.IDLE, Event.LOST): State.CLOSED,
    (State.ACTIVE, Event.LOST): State.CLOSED,
    (State.CLOSE_AFTER, Event.LOST): State.CLOSED,
    (State.LAST, Event.LOST): State.CLOSED,
    (State.CLOSING, Event.LOST): State.CLOSED,
    (State.LINGERING, Event.LOST): State.CLOSED,
    (State.REFUSED, Event.LOST): State.CLOSED,
})  # fmt: skip


def next_state(state: State, event: Event) -> State:
    """Where ``event`` takes a connection in ``state``; raises on a pair the table lacks."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise IllegalTransitionError(state, event) from None
