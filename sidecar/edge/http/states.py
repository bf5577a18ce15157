"""A client connection's life as one table: (state, event) -> next state, as h11 keeps it.

Pure: no I/O. :class:`~sidecar.edge.http.connection.Connection` moves only through
:func:`next_state`; a pair the table lacks is a bug, raised as ``IllegalTransitionError``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from sidecar.core.errors import IllegalTransitionError


class State(enum.Enum):
    """Where a client connection is."""

    IDLE = "idle"  # no request is being handled; the next one's head may be arriving
    ACTIVE = "active"  # a request is being handled; one pipelined behind it may be read
    LAST = "last"  # a request is being handled and its answer is the last: no more is parsed
    CLOSING = "closing"  # no request will be handled: what arrives is dropped until the close
    CLOSED = "closed"  # the transport is gone


class Event(enum.Enum):
    """What moves a client connection."""

    START = "start"  # a request's handler starts
    FINAL = "final"  # nothing more can be parsed (an upgrade, broken framing): the answer
    # under way, or the next one, is the last
    KEEP = "keep"  # an answer went out whole and the connection is kept for the next request
    CLOSE = "close"  # closed, or closing once the answer is out: no request will be handled
    LOST = "lost"  # the transport is gone


# Connections that are read from: what arrives in the others is dropped.
READING = frozenset({State.IDLE, State.ACTIVE})

TRANSITIONS: Mapping[tuple[State, Event], State] = MappingProxyType({
    (State.IDLE, Event.START): State.ACTIVE,
    # A request queued behind one whose framing broke starts, and its answer is the last.
    (State.LAST, Event.START): State.LAST,
    # Broken framing while a queued request waits for the client to read the answer before it.
    (State.IDLE, Event.FINAL): State.LAST,
    (State.ACTIVE, Event.FINAL): State.LAST,
    (State.LAST, Event.FINAL): State.LAST,
    (State.ACTIVE, Event.KEEP): State.IDLE,
    (State.IDLE, Event.CLOSE): State.CLOSING,
    (State.ACTIVE, Event.CLOSE): State.CLOSING,
    (State.LAST, Event.CLOSE): State.CLOSING,
    (State.CLOSING, Event.CLOSE): State.CLOSING,
    (State.IDLE, Event.LOST): State.CLOSED,
    (State.ACTIVE, Event.LOST): State.CLOSED,
    (State.LAST, Event.LOST): State.CLOSED,
    (State.CLOSING, Event.LOST): State.CLOSED,
})  # fmt: skip


def next_state(state: State, event: Event) -> State:
    """Where ``event`` takes a connection in ``state``; raises on a pair the table lacks."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise IllegalTransitionError(state, event) from None
