"""The door of a port over real sockets: partial heads that cannot fill it, per-address caps
that a shared address survives, and refusals that are answers (503, Retry-After, counted)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from sidecar.core.outcomes import EdgeFault
from sidecar.edge.http.limits import EdgeLimits
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer, Response
from sidecar.edge.http.server import HttpServer
from sidecar.entry.listen import bind
from tests.servers import until

GET_CLOSE = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
Writer = asyncio.StreamWriter
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Door:
    """A port under test: its server, its port, the refusals it reported and its clock."""

    server: HttpServer
    port: int
    refused: list[EdgeFault] = field(default_factory=list)
    now: list[float] = field(default_factory=lambda: [0.0])
    hold: asyncio.Event = field(default_factory=asyncio.Event)

    def advance(self, seconds: float) -> None:
        self.now[0] += seconds


Open = Callable[[EdgeLimits], Awaitable[Door]]


@pytest.fixture
async def door() -> AsyncIterator[Open]:
    """Start a port whose handler answers 200 (or holds a request marked x-hold until the
    test lets it go); its partial-head clock moves only by hand."""
    doors: list[Door] = []

    async def start(limits: EdgeLimits) -> Door:
        sock = bind("127.0.0.1", 0)
        now = [0.0]
        hold = asyncio.Event()

        async def handler(request: Request) -> Answer:
            if "x-hold" in request.headers:
                await hold.wait()
            return Response(200, b"ok")

        refused: list[EdgeFault] = []
        server = HttpServer(
            handler, limits, max_body_bytes=1024, refused=refused.append, clock=lambda: now[0]
        )
        await server.start(sock)
        opened = Door(server, sock.getsockname()[1], refused, now, hold)
        doors.append(opened)
        return opened

    yield start
    for opened in doors:
        opened.hold.set()
        await opened.server.close(0.5)


async def _from(address: str, port: int, send: bytes) -> Conn:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
    writer.write(send)
    return reader, writer


async def _served(address: str, port: int) -> bool:
    """A whole request from ``address`` on a new connection, answered 200."""
    reader, writer = await _from(address, port, GET_CLOSE)
    try:
        async with asyncio.timeout(3):
            return (await reader.read()).startswith(b"HTTP/1.1 200")
    except (ConnectionResetError, TimeoutError):
        return False
    finally:
        writer.close()


async def _open_count(door: Door, n: int) -> bool:
    return door.server.count.open == n


def _close_all(conns: list[Conn]) -> None:
    for _reader, writer in conns:
        writer.close()


async def test_partial_heads_from_two_addresses_lock_nobody_out(door: Open) -> None:
    """A port filled with one-byte heads from two addresses: every request from a third one is
    served, each closing a stale head, which is answered 503 with Retry-After."""
    d = await door(
        EdgeLimits(max_connections=32, max_connections_per_client=16, max_partial_heads=8)
    )
    flood = [await _from(f"127.0.0.{2 + i % 2}", d.port, b"G") for i in range(32)]
    try:
        assert await until(lambda: _open_count(d, 32))
        d.advance(2.0)
        served = [await _served("127.0.0.4", d.port) for _ in range(20)]
        assert served == [True] * 20
        async with asyncio.timeout(3):
            answer = await flood[0][0].read()
    finally:
        _close_all(flood)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503")
    assert b"Retry-After: 2" in head  # one connection went in the port's 2 s: one in 2 s
    assert json.loads(body)["error"]["code"] == "too_many_partial_heads"
    assert d.refused.count("too_many_partial_heads") >= 20


async def test_a_flood_from_a_shared_address_closes_its_own_heads(door: Open) -> None:
    """Heads up to the per-address cap from the address a gateway shares: the gateway's next
    requests are served from that same address, one of the flood's heads making room."""
    d = await door(EdgeLimits(max_connections=64, max_connections_per_client=16))
    flood = [await _from("127.0.0.2", d.port, b"P") for _ in range(16)]
    try:
        assert await until(lambda: _open_count(d, 16))
        d.advance(2.0)
        served = [await _served("127.0.0.2", d.port) for _ in range(20)]
    finally:
        _close_all(flood)
    assert served == [True] * 20
    # One head made room for the first; each served request's close left room for the next.
    assert d.refused == ["too_many_partial_heads"]


async def test_a_fresh_connection_is_not_closed_for_a_newer_one(door: Open) -> None:
    """Within its grace a partial head is left alone: at the cap with only fresh heads, the
    newcomer is the one refused (503), and the fresh connection is still served."""
    d = await door(EdgeLimits(max_connections=1, max_connections_per_client=1))
    fresh = await _from("127.0.0.2", d.port, b"GET / HTTP/1.1\r\n")
    try:
        assert await until(lambda: _open_count(d, 1))
        refused = await _from("127.0.0.3", d.port, b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n")
        async with asyncio.timeout(3):
            answer = await refused[0].read()
        refused[1].close()
        fresh[1].write(b"Host: x\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(3):
            assert (await fresh[0].read()).startswith(b"HTTP/1.1 200")
    finally:
        fresh[1].close()
    assert answer.startswith(b"HTTP/1.1 503")
    assert b'"too_many_connections"' in answer
    assert d.refused == ["too_many_connections"]


@pytest.mark.parametrize(
    ("per_client", "fault"),
    [
        pytest.param(64, "too_many_connections", id="port-cap"),
        pytest.param(4, "too_many_client_connections", id="address-cap"),
    ],
)
async def test_every_refusal_at_a_cap_is_a_503_the_client_reads(
    door: Open, per_client: int, fault: str
) -> None:
    """Four streams hold the cap: each of 20 more requests, body and all, reads a JSON 503 with
    Retry-After, never a reset, and each refusal is reported."""
    d = await door(EdgeLimits(max_connections=4, max_connections_per_client=per_client))
    held = b"GET / HTTP/1.1\r\nHost: x\r\nx-hold: 1\r\n\r\n"
    busy = [await _from("127.0.0.2", d.port, held) for _ in range(4)]
    post = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000
    answers = []
    try:
        assert await until(lambda: _open_count(d, 4))
        for _ in range(20):
            reader, writer = await _from("127.0.0.2", d.port, post)
            try:
                async with asyncio.timeout(3):
                    answers.append(await reader.read())
            finally:
                writer.close()
    finally:
        _close_all(busy)
    heads = {answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[0] for answer in answers}
    assert heads == {b"HTTP/1.1 503 Service Unavailable"}
    assert all(b"Retry-After: 1" in answer for answer in answers)
    assert all(f'"{fault}"'.encode() in answer for answer in answers)
    assert d.refused == [fault] * 20


async def test_a_header_timeout_is_reported(door: Open) -> None:
    """A head that never completes gets its 408, and the door reports it."""
    d = await door(EdgeLimits(header_timeout_s=0.05))
    reader, writer = await _from("127.0.0.2", d.port, b"GET / HT")
    try:
        async with asyncio.timeout(3):
            assert (await reader.read()).startswith(b"HTTP/1.1 408")
    finally:
        writer.close()
    assert d.refused == ["header_timeout"]
