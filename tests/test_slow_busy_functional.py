"""Issue 48 row 4: a port filled by two addresses with slow bodies locks nobody out: a newcomer
from another address, or from one of theirs, takes the room of the slowest of the address holding
most, which is answered 408. Over real sockets, through the whole sidecar."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from benchmarks.hostile_requests import completion_head
from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import sidecars, until

__all__ = ["double"]

CAP, SHARE = 40, 20
COMPLETION = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 4}).encode()
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
async def server(double: EngineDouble) -> AsyncIterator[SidecarServer]:
    async with sidecars(double.url) as start:
        yield await start(
            SIDECAR_MAX_CONNECTIONS=str(CAP),
            SIDECAR_MAX_CONNECTIONS_PER_CLIENT=str(SHARE),
            SIDECAR_MAX_CONCURRENT_CALLS="64",
        )


async def _slow_body(address: str, port: int) -> Conn:
    """A completion whose 16 kB body has sent 100 bytes, and then waits."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
    writer.write(completion_head(16000) + b" " * 100)
    return reader, writer


async def _served(address: str, port: int) -> int:
    """A whole completion from ``address`` on a new connection: its status (0: none came)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
        % (len(COMPLETION), COMPLETION)
    )
    try:
        async with asyncio.timeout(3):
            status_line = await reader.readline()
            return int(status_line.split()[1]) if status_line else 0
    except (ConnectionError, TimeoutError):
        return 0
    finally:
        writer.close()


async def test_slow_bodies_from_two_addresses_lock_nobody_out(server: SidecarServer) -> None:
    """2 addresses x 20 slow bodies fill a 40-connection port: once they have been busy a
    second, every completion from a third address and from one of theirs is served, the first
    taking the room of a slow body, which gets a 408 (each served one's close leaves room for
    the next)."""
    assert server.proxy_server is not None
    port, table = server.proxy_port, server.proxy_server.connections
    flood = [await _slow_body(f"127.0.0.{2 + i % 2}", port) for i in range(CAP)]

    async def full() -> bool:
        return table.count.open == CAP

    try:
        assert await until(full)
        assert await _served("127.0.0.4", port) == 503  # within their grace: still a wall
        await asyncio.sleep(1.1)  # the busy connections' grace, on the real clock
        others = [await _served("127.0.0.4", port) for _ in range(6)]
        shared = [await _served("127.0.0.2", port) for _ in range(6)]
        async with asyncio.timeout(3):
            evicted = await flood[0][0].read()
    finally:
        for _reader, writer in flood:
            writer.close()
    assert (others, shared) == ([200] * 6, [200] * 6)
    assert evicted.startswith(b"HTTP/1.1 408")
    assert table.count.evicted_busy == 1


async def test_a_shared_address_at_its_share_closes_its_own_slowest(
    server: SidecarServer,
) -> None:
    """20 slow bodies hold an address's whole share, the port half empty: a completion from the
    same address (a gateway's) is served, one of the slow bodies making room."""
    assert server.proxy_server is not None
    port, table = server.proxy_port, server.proxy_server.connections
    flood = [await _slow_body("127.0.0.2", port) for _ in range(SHARE)]

    async def full() -> bool:
        return table.count.open == SHARE

    try:
        assert await until(full)
        await asyncio.sleep(1.1)  # the busy connections' grace, on the real clock
        served = [await _served("127.0.0.2", port) for _ in range(6)]
    finally:
        for _reader, writer in flood:
            writer.close()
    assert served == [200] * 6
    assert table.count.evicted_busy == 1
