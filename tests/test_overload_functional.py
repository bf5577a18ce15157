"""The overload manager over real sockets, its resource monitor a fake the test moves: past the
first share new connections get a 503 and kept-alive ones still work; past the second, the
connections holding most while doing least are closed; below, connections are taken again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from sidecar.edge.overload import Level
from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings
from tests.engine_double import EngineDouble, double
from tests.servers import BASE_ENV, until

__all__ = ["double"]

MIB = 1 << 20
GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class Overloaded:
    server: SidecarServer
    rss: list[int] = field(default_factory=lambda: [10 * MIB])

    async def reach(self, rss_mib: int, level: Level) -> None:
        """The fake monitor reads ``rss_mib`` from now; wait for the manager to act on it."""
        self.rss[0] = rss_mib * MIB
        manager = self.server.overload
        assert manager is not None

        async def there() -> bool:
            return manager.level == level

        assert await until(there)


@pytest.fixture
async def overloaded(double: EngineDouble) -> AsyncIterator[Overloaded]:
    rss = [10 * MIB]
    env = {**BASE_ENV, "SIDECAR_UPSTREAM_URL": double.url, "SIDECAR_OVERLOAD_MEMORY": "100MiB"}
    server = SidecarServer(load_settings(env), resident_bytes=lambda: rss[0])
    await server.start()
    yield Overloaded(server, rss)
    await server.stop()


async def answer_status(reader: asyncio.StreamReader) -> int:
    """Read one whole answer; its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line)
    length = {k.lower(): v for k, v in fields.items()}.get("content-length")
    if length is None:
        await reader.readuntil(b"\r\n0\r\n\r\n")
    else:
        await reader.readexactly(int(length))
    return int(head.split()[1])


async def kept_alive(port: int) -> Conn:
    """A connection that got one answer and stays open, idle."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET)
    assert await answer_status(reader) == 200
    return reader, writer


async def status_of_new(port: int) -> int:
    """A GET on a new connection: its status (0: none)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
    try:
        async with asyncio.timeout(3):
            line = await reader.readline()
            return int(line.split()[1]) if line else 0
    except (ConnectionError, TimeoutError):
        return 0
    finally:
        writer.close()


async def test_each_level_acts_on_the_port(overloaded: Overloaded) -> None:
    """90 % of the memory: a new connection gets 503 too_many_connections, a kept-alive one is
    still served. 96 %: idle connections and a slow body are closed (the body with a 408).
    50 %: new connections are served again."""
    server = overloaded.server
    port = server.proxy_port
    idle = [await kept_alive(port) for _ in range(3)]
    slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", port)
    slow_writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9000\r\n\r\n" + b" " * 5000
    )
    try:
        await overloaded.reach(90, "stop_accepting")  # at the share: none over it to shed
        assert await status_of_new(port) == 503
        reader, writer = idle[0]
        writer.write(GET)
        assert await answer_status(reader) == 200
        await overloaded.reach(96, "shed")
        async with asyncio.timeout(3):
            assert (await slow_reader.readline()).startswith(b"HTTP/1.1 408")
            for reader, _writer in idle:
                await reader.read()  # the end of each: shed
        await overloaded.reach(50, "normal")
        assert await status_of_new(port) == 200
    finally:
        slow_writer.close()
        for _reader, writer in idle:
            writer.close()
    assert server.overload is not None
    assert server.overload.shed_total == 4
