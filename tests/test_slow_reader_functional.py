"""Issue 48 row 3: a client that reads a large answer slowly holds a bounded window of it in the
sidecar: while its socket's buffer is over the high-water mark the engine is not read (its own
send buffer fills instead), over real sockets; once it reads, the whole answer comes."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
from collections.abc import AsyncIterator

import httptools
import pytest

from sidecar.edge.engine.connection import EngineConnection
from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double, numbered_events
from tests.servers import sidecars

__all__ = ["double"]

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})


def request(mode: str) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-double: {mode}\r\n"
        "Connection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n\r\n{BODY}"
    ).encode()


ONE_READ = 256 * 1024  # the most one socket read hands over (asyncio's and uvloop's)


@pytest.fixture
async def server(double: EngineDouble) -> AsyncIterator[SidecarServer]:
    async with sidecars(double.url) as start:
        yield await start(SIDECAR_CLIENT_WRITE_TIMEOUT_MS="30000")


def engine_connections() -> list[EngineConnection]:
    return [o for o in gc.get_objects() if isinstance(o, EngineConnection)]


def reading(connection: EngineConnection) -> bool:
    assert connection.transport is not None
    return connection.transport.is_reading()


async def stopped(server: SidecarServer) -> EngineConnection:
    """The engine connection, once the sidecar has stopped reading it (bounded wait)."""
    async with asyncio.timeout(10):
        while True:
            paused = [c for c in engine_connections() if c.phase.name == "BODY"]
            if paused and not reading(paused[0]):
                return paused[0]
            await asyncio.sleep(0.05)


async def slow_reader(server: SidecarServer, mode: str) -> tuple[socket.socket, EngineConnection]:
    """A client with a 4 KiB receive buffer that asked for ``mode``'s answer and does not read,
    once the sidecar has stopped reading the engine for it."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", server.proxy_port))
    await loop.sock_sendall(sock, request(mode))
    engine = await stopped(server)
    await asyncio.sleep(0.3)  # nothing moves while nobody reads
    return sock, engine


def assert_bounded(server: SidecarServer, engine: EngineConnection) -> None:
    """The engine unread; the client's buffer at most its high-water mark and one piece past
    it; the engine's bytes held at most one read."""
    assert not reading(engine)
    assert server.proxy_server is not None
    (client,) = list(server.proxy_server.connections)
    high = client.transport.get_write_buffer_limits()[1]
    assert client.transport.get_write_buffer_size() <= 2 * high
    assert engine._held <= ONE_READ


async def test_a_slow_reader_holds_a_bounded_window_of_a_large_answer(
    server: SidecarServer,
) -> None:
    """A 3 MB stream of 1 KiB events to a client that does not read: bounded while it does
    not; read at last, every byte of it arrives."""
    sock, engine = await slow_reader(server, "numbered")
    assert_bounded(server, engine)
    received = bytearray()
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(30):
        while chunk := await loop.sock_recv(sock, 1 << 16):
            received += chunk
    sock.close()
    assert body_of(bytes(received)) == b"".join(numbered_events())


async def test_an_engine_writing_large_pieces_is_not_read_past_the_window(
    server: SidecarServer,
) -> None:
    """64 KiB events as fast as the socket takes them (an engine's whole answer arriving in
    reads of up to 256 KiB): the same bounds, each read written to the client in pieces."""
    sock, engine = await slow_reader(server, "endless")
    try:
        assert_bounded(server, engine)
    finally:
        sock.close()


def body_of(answer: bytes) -> bytes:
    """The body of a whole HTTP/1.1 answer, de-chunked by llhttp."""
    body = bytearray()

    class Collect:
        def on_body(self, data: bytes) -> None:
            body.extend(data)

    httptools.HttpResponseParser(Collect()).feed_data(answer)
    return bytes(body)


async def test_a_slow_reader_gives_its_place_up_to_a_waiting_request(double: EngineDouble) -> None:
    """One place (SIDECAR_MAX_CONCURRENT_CALLS=1) held by a client that stopped reading its
    long answer: a second request waits for it; the stall (0.2 s) that finds it waiting ends the
    slow reader's stream, and the second reaches the engine and is served, where it would have
    been refused after its 3 s wait (the 30 s write deadline still far off)."""
    async with sidecars(double.url) as start:
        server = await start(
            SIDECAR_ADMISSION="count",
            SIDECAR_MAX_CONCURRENT_CALLS="1",
            SIDECAR_MAX_QUEUE="4",
            SIDECAR_CLIENT_STALL_MS="200",
            SIDECAR_CLIENT_WRITE_TIMEOUT_MS="30000",
        )
        sock, _engine = await slow_reader(server, "endless")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
        try:
            writer.write(request("none"))
            async with asyncio.timeout(10):
                answer = await reader.read()  # the whole answer: its connection closes after it
        finally:
            writer.close()
            sock.close()
    assert answer.startswith(b"HTTP/1.1 200")
    assert b"fallback" not in answer  # served, not the busy answer (a 200 SSE fallback event)
    assert double.generating() == 2
