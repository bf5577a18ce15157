"""A client connection's life apart from its requests: its :class:`~sidecar.edge.http.states.State`,
moved only by the rows of one table, its one :class:`~sidecar.edge.http.deadline.Deadline` at a
time, and each way it ends: closed, cut off, half-closed to read off what its client still sends,
refused at the door with a 503 it can read, or out of time."""

from __future__ import annotations

import asyncio
from typing import Any

from sidecar.core.outcomes import EdgeFault
from sidecar.edge.flow import FlowControl
from sidecar.edge.http.deadline import Deadline, Due
from sidecar.edge.http.port import LINGER_S, MAX_LINGERING, Port
from sidecar.edge.http.states import Event, State, next_state
from sidecar.edge.message import raw_answer


class Life:
    """One client connection's state, deadline and ends, over its transport."""

    __slots__ = ("_flow", "_port", "_transport", "deadline", "state")

    def __init__(self, transport: asyncio.Transport, flow: FlowControl, port: Port[Any]) -> None:
        self._transport, self._flow, self._port = transport, flow, port
        self.deadline = Deadline(asyncio.get_running_loop(), self._expired)
        self.state = State.IDLE

    def move(self, event: Event) -> None:
        """The one way the state changes: a row of the table in :mod:`states`."""
        self.state = next_state(self.state, event)

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def close(self) -> None:
        """No request will be handled: close once what was written is out."""
        self.move(Event.CLOSE)
        self._transport.close()

    def cut_off(self) -> None:
        """Close now, what was written and not sent dropped (an answer that broke under way)."""
        self.move(Event.CLOSE)
        self._transport.abort()

    def close_if_open(self) -> None:
        if not self.closed:
            self._transport.close()

    def abort_if_open(self) -> None:
        if not self.closed:
            self._transport.abort()

    def end(self, *, unread: bool) -> None:
        """Close once the answer is out; with bytes unread, half-close and read them off first."""
        if unread and self._can_half_close():
            self.move(Event.LINGER)
            self._read_off()
        else:
            self.close()

    def refuse(self, fault: EdgeFault) -> None:
        """Refused at the door, or closed to make room: a 503 the client can read, never a bare
        reset. What it sent is read off for a moment first (closing with unread bytes would send
        a reset), while few refused connections are doing so: they hold descriptors beyond the
        port's cap."""
        port = self._port
        port.refused(fault)
        self._transport.write(raw_answer(fault, retry_after_s=port.connections.room_s()))
        if port.lingering < MAX_LINGERING:
            port.lingering += 1  # one more REFUSED: counted out when it is lost
            self.move(Event.REFUSE)
            if self._can_half_close():
                self._read_off()
            else:
                self._transport.close()
        else:
            self.close()

    def lost(self) -> None:
        """The transport is gone."""
        if self.state is State.REFUSED:
            self._port.lingering -= 1
        self.move(Event.LOST)
        self.deadline.clear()

    def _can_half_close(self) -> bool:
        transport = self._transport
        return transport.can_write_eof() and not transport.is_closing()

    def _read_off(self) -> None:
        """Half-close and read off what the client still sends, for a moment."""
        self._transport.write_eof()
        self._flow.resume_reading()
        self.deadline.set("linger", LINGER_S)

    def _expired(self, due: Due) -> None:
        if self.closed:
            return
        transport = self._transport
        if due == "head":
            self._port.connections.count.head_timeouts += 1
            self._port.refused("header_timeout")
            self.move(Event.CLOSE)
            transport.write(raw_answer("header_timeout"))
            transport.close()
        elif transport.get_write_buffer_size() > 0:
            transport.abort()  # a client that stopped reading: close() would wait on it
        else:
            transport.close()
