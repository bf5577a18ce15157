"""Issue 48 rows 1-2: a connection that pipelines thousands of requests and never reads holds at
most one read of them unparsed and one request parsed ahead, and gets two requests run, the second
answer its last; one that sends a request at a time and never reads gets what its own receive
buffer takes, and one more. Over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from benchmarks.hostile_requests import chat, get
from sidecar.edge.http.connection import Connection
from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import sidecars, until

__all__ = ["double"]

PIPELINED = 2_000
# One read of the socket (asyncio's and uvloop's are at most 256 KiB), and llhttp's slack.
ONE_READ = 256 * 1024
# What a 4 KiB receive buffer takes of answers to GET /v1/models (22 seen; 81 before the
# sidecar's kernel send queue counted as unread too).
RECEIVE_BUFFER_TOOK = 40


@pytest.fixture
async def server(double: EngineDouble) -> AsyncIterator[SidecarServer]:
    async with sidecars(double.url) as start:
        yield await start(SIDECAR_MAX_CONCURRENT_CALLS="64")


def connection_of(server: SidecarServer) -> Connection:
    assert server.proxy_server is not None
    (only,) = list(server.proxy_server.connections)
    return only


async def settle(double: EngineDouble) -> int:
    """How many requests reached the engine, once that number stops moving."""
    seen = -1
    while seen != len(double.seen):
        seen = len(double.seen)
        await asyncio.sleep(0.2)
    return seen


async def answers_in_order(reader: asyncio.StreamReader, count: int) -> list[tuple[str, bool]]:
    """The X-Request-Id of each of ``count`` answers, as they come, and whether it says the
    connection closes."""
    ids = []
    for _ in range(count):
        head = await reader.readuntil(b"\r\n\r\n")
        fields = dict(
            line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
        )
        lowered = {k.lower(): v for k, v in fields.items()}
        ids.append((lowered["x-request-id"], lowered.get("connection") == "close"))
        if "content-length" in lowered:
            await reader.readexactly(int(lowered["content-length"]))
        else:  # chunked: the relayed stream, up to its last chunk
            await reader.readuntil(b"\r\n0\r\n\r\n")
    return ids


async def rest_of(reader: asyncio.StreamReader) -> bytes:
    """What the connection still sends before its end (a reset after the linger ends it too)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


@pytest.mark.parametrize(
    "make", [pytest.param(get, id="gets"), pytest.param(chat, id="streamed-chats")]
)
async def test_a_client_that_never_reads_gets_two_requests_run(
    server: SidecarServer, double: EngineDouble, make: Callable[[int], bytes]
) -> None:
    """2,000 pipelined requests from a socket that never reads (a 4 KiB receive buffer): two
    reach the engine, the first and the one read ahead of it, whose answer says the connection
    closes; what came after is read off unparsed, never run. Read, the two answers come in order,
    then the connection's end."""
    burst = b"".join(make(i) for i in range(PIPELINED))
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", server.proxy_port))
    sending = asyncio.create_task(loop.sock_sendall(sock, burst))
    assert await settle(double) == 2
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        async with asyncio.timeout(10):
            heads = await answers_in_order(reader, 2)
            assert await rest_of(reader) == b""
    finally:
        sending.cancel()
        writer.close()
    assert [request_id for request_id, _close in heads] == ["r0", "r1"]
    assert [close for _request_id, close in heads] == [False, True]
    assert double.request_ids == ["r0", "r1"]


async def test_a_client_that_sends_one_at_a_time_and_never_reads_is_cut_off(
    server: SidecarServer, double: EngineDouble
) -> None:
    """A request sent after the engine took the one before, from a socket that never reads:
    once answers wait unacknowledged in the sidecar's kernel (the client's buffer is full), the
    next request is ahead of its reads, and its answer is the last. What ran is what the
    client's own receive buffer took, and one more."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", server.proxy_port))
    sent = 0

    async def taken() -> bool:
        return len(double.seen) == sent

    with contextlib.suppress(ConnectionError):
        while sent < PIPELINED:
            await loop.sock_sendall(sock, get(sent))
            sent += 1
            if not await until(taken, timeout_s=0.5):
                break  # not run: the connection is ending
    sock.close()
    assert sent < PIPELINED  # the connection ended
    assert 2 <= len(double.seen) <= RECEIVE_BUFFER_TOOK
