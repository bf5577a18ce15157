"""The engine connection's life as one table: (phase, event) -> next phase, as h11 keeps it.

Pure: no I/O. :class:`~sidecar.edge.engine.connection.EngineConnection` moves only through
:func:`next_phase`; a pair the table lacks is a bug, raised as ``IllegalTransitionError``.
Whether a connection may carry another request is read from its phase (COMPLETE, not SPENT).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

from sidecar.core.errors import IllegalTransitionError


class Phase(enum.Enum):
    """Where a connection is in its request and answer."""

    IDLE = "idle"  # no request on it: new, or kept in the pool
    SENT = "sent"  # a request written; not one byte of its answer yet
    HEAD = "head"  # the answer's head arriving (interim 1xx heads skipped)
    BODY = "body"  # the head read, the body arriving
    COMPLETE = "complete"  # the answer parsed to its end, the connection kept for another
    # request; its last pieces may wait for a read
    SPENT = "spent"  # the answer parsed to its end, and the engine closes the connection after
    # it (its head said so, or its body ended with the connection): never parked
    BROKEN = "broken"  # failed or closed mid-answer (``error`` says why): never used again


class EngineEvent(enum.Enum):
    """What moves a connection to the engine."""

    SEND = "send"  # a request written on it
    FIRST_BYTE = "first_byte"  # the first bytes of the answer arrived
    HEAD = "head"  # the answer's final head parsed: a body follows
    HEAD_ONLY = "head_only"  # the final head of a HEAD request's answer: nothing follows
    BODY_END = "body_end"  # llhttp parsed the body to its framed end
    LAST_END = "last_end"  # the answer (a body, or a HEAD request's head) ended, and its head
    # said the engine closes the connection after it
    CLOSED_AT_END = "closed_at_end"  # the engine closed where a close-delimited body ends
    FAIL = "fail"  # broken: bad bytes, a reset, a timeout, a close mid-answer
    PARK = "park"  # read to the end and kept in the pool for another request


ANSWERING = frozenset({Phase.SENT, Phase.HEAD, Phase.BODY})

TRANSITIONS: Mapping[tuple[Phase, EngineEvent], Phase] = MappingProxyType({
    (Phase.IDLE, EngineEvent.SEND): Phase.SENT,
    (Phase.IDLE, EngineEvent.FAIL): Phase.BROKEN,
    (Phase.SENT, EngineEvent.FIRST_BYTE): Phase.HEAD,
    (Phase.SENT, EngineEvent.FAIL): Phase.BROKEN,
    (Phase.HEAD, EngineEvent.HEAD): Phase.BODY,
    (Phase.HEAD, EngineEvent.HEAD_ONLY): Phase.COMPLETE,
    (Phase.HEAD, EngineEvent.LAST_END): Phase.SPENT,
    (Phase.HEAD, EngineEvent.FAIL): Phase.BROKEN,
    (Phase.BODY, EngineEvent.BODY_END): Phase.COMPLETE,
    (Phase.BODY, EngineEvent.LAST_END): Phase.SPENT,
    (Phase.BODY, EngineEvent.CLOSED_AT_END): Phase.SPENT,
    (Phase.BODY, EngineEvent.FAIL): Phase.BROKEN,
    (Phase.COMPLETE, EngineEvent.PARK): Phase.IDLE,
    (Phase.COMPLETE, EngineEvent.FAIL): Phase.BROKEN,
    (Phase.SPENT, EngineEvent.FAIL): Phase.BROKEN,
})  # fmt: skip


def next_phase(phase: Phase, event: EngineEvent) -> Phase:
    """Where ``event`` takes a connection in ``phase``; raises on a pair the table lacks."""
    try:
        return TRANSITIONS[phase, event]
    except KeyError:
        raise IllegalTransitionError(phase, event) from None
