"""Issue 48 rows 1-2: a connection that pipelines thousands of requests and never reads holds at
most one read of them unparsed and one request parsed ahead, and gets no request run whose answer
has nowhere to go; once it reads, every answer comes, in order. Over real sockets."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from sidecar.edge.http.connection import Connection
from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import sidecars

__all__ = ["double"]

PIPELINED = 2_000
# One read of the socket (asyncio's and uvloop's are at most 256 KiB), and llhttp's slack.
ONE_READ = 256 * 1024
# What a 4 KiB receive buffer and the sidecar's kernel send buffer take of answers nobody reads.
UNREAD_RAN = 200


@pytest.fixture
async def server(double: EngineDouble) -> AsyncIterator[SidecarServer]:
    async with sidecars(double.url) as start:
        yield await start(SIDECAR_MAX_CONCURRENT_CALLS="64")


def get(i: int) -> bytes:
    return f"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Request-Id: r{i}\r\n\r\n".encode()


def chat(i: int) -> bytes:
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: r{i}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


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


async def answers_in_order(reader: asyncio.StreamReader, count: int) -> list[str]:
    """The X-Request-Id of each of ``count`` answers, as they come."""
    ids = []
    for _ in range(count):
        head = await reader.readuntil(b"\r\n\r\n")
        fields = dict(
            line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line
        )
        lowered = {k.lower(): v for k, v in fields.items()}
        ids.append(lowered["x-request-id"])
        if "content-length" in lowered:
            await reader.readexactly(int(lowered["content-length"]))
        else:  # chunked: the relayed stream, up to its last chunk
            await reader.readuntil(b"\r\n0\r\n\r\n")
    return ids


@pytest.mark.parametrize(
    "make", [pytest.param(get, id="gets"), pytest.param(chat, id="streamed-chats")]
)
async def test_a_client_that_never_reads_gets_nothing_run_for_it(
    server: SidecarServer, double: EngineDouble, make: Callable[[int], bytes]
) -> None:
    """2,000 pipelined requests from a socket that never reads (a 4 KiB receive buffer): the
    sidecar stops reading after one read, holds one request parsed ahead, and runs only those
    whose answers the client's socket took (its own buffer, not the sidecar's); read, every one
    is answered, in order."""
    burst = b"".join(make(i) for i in range(PIPELINED))
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", server.proxy_port))
    sending = asyncio.create_task(loop.sock_sendall(sock, burst))
    ran = await settle(double)
    connection = connection_of(server)
    assert ran <= UNREAD_RAN
    assert len(connection._queue) <= 1
    assert len(connection._reader.backlog) <= ONE_READ
    assert not connection.transport.is_reading()
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        async with asyncio.timeout(60):
            await sending
            ids = await answers_in_order(reader, PIPELINED)
    finally:
        writer.close()
    assert ids == [f"r{i}" for i in range(PIPELINED)]
    assert len(double.seen) == PIPELINED
