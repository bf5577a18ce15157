"""A connection's FlowControl and Deadline, on a real transport and the running loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from sidecar.edge.flow import FlowControl
from sidecar.edge.http.deadline import Deadline, Due
from tests.fake_time import FakeTime
from tests.servers import until


@pytest.fixture
async def transport() -> AsyncIterator[asyncio.Transport]:
    """One end of a connected socket pair, as an asyncio transport."""
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    made, _protocol = await loop.create_connection(asyncio.Protocol, sock=ours)
    yield made
    made.close()
    theirs.close()


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_writers_wait_while_writing_is_paused(transport: asyncio.Transport) -> None:
    """drain() returns at once while writable, waits while paused, and returns on resume."""
    flow = FlowControl(transport)
    await asyncio.wait_for(flow.drain(), 1)
    flow.pause_writing()
    waiting = asyncio.create_task(flow.drain())
    await turns()
    assert not waiting.done()
    flow.resume_writing()
    await asyncio.wait_for(waiting, 1)


class Flowing(asyncio.Protocol):
    """A protocol whose writing pauses and resumes reach its FlowControl, as a Connection's do."""

    flow: FlowControl

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.flow = FlowControl(transport)  # type: ignore[arg-type]

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()


async def test_the_next_request_waits_until_the_answer_has_left() -> None:
    """when_flushed runs its step at once with nothing unwritten; with an answer still in the
    buffer (its client not reading), only once the client has read it all, the limits then
    as they were; a connection that goes meanwhile runs it never, and wakes its writers."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(Flowing, sock=ours)
    flow, ran = protocol.flow, []
    limits = transport.get_write_buffer_limits()
    try:
        assert flow.when_flushed(lambda: ran.append("now"))
        transport.write(b"x" * 4_000_000)  # more than the socket pair's buffers: some unwritten
        assert not flow.when_flushed(
            lambda: ran.append(f"later at {transport.get_write_buffer_size()}")
        )
        assert flow.writing_paused
        assert transport.get_write_buffer_limits() == (0, 0)
        assert ran == ["now"]
        while transport.get_write_buffer_size():
            await asyncio.sleep(0.001)
            with contextlib.suppress(BlockingIOError):
                while theirs.recv(1 << 20):
                    pass
        await turns()
        assert ran == ["now", "later at 0"]
        assert transport.get_write_buffer_limits() == limits
        transport.write(b"x" * 4_000_000)
        assert not flow.when_flushed(lambda: ran.append("never"))
        waiting = asyncio.create_task(flow.drain())
        flow.release()
        await asyncio.wait_for(waiting, 1)
        assert ran == ["now", "later at 0"]
    finally:
        transport.abort()
        theirs.close()


async def test_reading_is_paused_and_resumed_once(transport: asyncio.Transport) -> None:
    """Pausing twice and resuming twice reach the transport once each way."""
    flow = FlowControl(transport)
    flow.pause_reading()
    flow.pause_reading()
    assert not transport.is_reading()
    flow.resume_reading()
    flow.resume_reading()
    assert transport.is_reading()


async def test_a_deadline_set_again_replaces_the_one_before() -> None:
    """Only the last deadline set fires; a cleared one never does."""
    fired: list[Due] = []
    deadline = Deadline(asyncio.get_running_loop(), fired.append)
    deadline.set("head", 0)
    deadline.set("idle", 0)
    await turns()
    assert (fired, deadline.due) == (["idle"], None)
    deadline.set("linger", 0)
    deadline.clear()
    await turns()
    assert fired == ["idle"]


async def test_unacknowledged_counts_what_the_peer_has_not_taken() -> None:
    """Bytes written to a TCP peer that reads nothing stay unacknowledged once its receive
    buffer is full (the transport's and the kernel's together); once it reads them all, none."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.socket()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    peer.connect(listener.getsockname())
    ours, _ = listener.accept()
    listener.close()
    made, _protocol = await loop.create_connection(asyncio.Protocol, sock=ours)
    flow = FlowControl(made)
    try:
        assert flow.unacknowledged() == 0
        made.write(b"x" * (1 << 20))
        await turns()
        assert flow.unacknowledged() > 0
        peer.setblocking(False)
        taken = 0
        async with asyncio.timeout(5):
            while taken < 1 << 20:
                with contextlib.suppress(BlockingIOError):
                    taken += len(peer.recv(1 << 16))
                await asyncio.sleep(0)

        async def acknowledged() -> bool:
            return flow.unacknowledged() == 0

        assert await until(acknowledged)
    finally:
        made.close()
        peer.close()


async def test_a_rest_stops_reading_whatever_resumes_it(transport: asyncio.Transport) -> None:
    """A rest stops reading for its time: a resume meanwhile (an answer left) waits for its end,
    and a pause meanwhile (a pipelined request waits) outlasts it."""
    fake = FakeTime()
    flow = FlowControl(transport, clock=fake.clock, call_later=fake.call_later)
    flow.rest(0.5)
    assert not transport.is_reading()
    fake.advance(0.2)
    assert flow.rested_s() == pytest.approx(0.2)
    flow.pause_reading()
    flow.resume_reading()
    assert not transport.is_reading()
    fake.advance(0.3)
    assert transport.is_reading()
    flow.rest(0.5)
    flow.pause_reading()
    fake.advance(0.5)
    assert not transport.is_reading()
    assert flow.rested_s() == 0
    flow.resume_reading()
    assert transport.is_reading()
