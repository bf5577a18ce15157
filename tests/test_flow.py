"""A connection's FlowControl and Deadline, on a real transport and the running loop."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from sidecar.edge.flow import FlowControl
from sidecar.edge.http.deadline import Deadline, Due


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


async def test_the_next_request_waits_for_the_client_to_read(
    transport: asyncio.Transport,
) -> None:
    """when_writable runs its step at once if writable, else only when writing resumes; a
    connection that goes meanwhile runs it never, and wakes its writers."""
    flow, ran = FlowControl(transport), []
    flow.when_writable(lambda: ran.append("now"))
    flow.pause_writing()
    flow.when_writable(lambda: ran.append("later"))
    assert ran == ["now"]
    flow.resume_writing()
    assert ran == ["now", "later"]
    flow.pause_writing()
    flow.when_writable(lambda: ran.append("never"))
    waiting = asyncio.create_task(flow.drain())
    flow.release()
    await asyncio.wait_for(waiting, 1)
    flow.resume_writing()
    assert ran == ["now", "later"]


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
