"""Issue 48 row 5: a chunked body in chunks no client needs is refused once they count, before it
costs the loop a callback per two bytes; chunked bodies of ordinary chunks pass. Over real
sockets, through the whole sidecar."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from benchmarks.hostile_requests import CHUNKED_HEAD, chunked, completion
from sidecar.edge.http.reader import FREE_CHUNKS, MIN_CHUNK_BYTES
from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import sidecars

__all__ = ["double"]


@pytest.fixture
async def server(double: EngineDouble) -> AsyncIterator[SidecarServer]:
    async with sidecars(double.url) as start:
        yield await start()


async def exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, then read to the connection's end."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        async with asyncio.timeout(5):
            return await reader.read()
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


@pytest.mark.parametrize(
    ("padding", "size"),
    [
        pytest.param(20_000, 1024, id="1-KiB-chunks"),
        pytest.param(20_000, MIN_CHUNK_BYTES, id="at-the-floor"),
        pytest.param(2 * FREE_CHUNKS - 80, 2, id="few-tiny-chunks"),
    ],
)
async def test_chunked_bodies_of_ordinary_chunks_pass(
    server: SidecarServer, double: EngineDouble, padding: int, size: int
) -> None:
    """Chunks of 1 KiB, chunks at the floor, and a body of under FREE_CHUNKS 2-byte chunks: 200."""
    answer = await exchange(
        server.proxy_port,
        CHUNKED_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        + chunked(completion(padding), size),
    )
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert double.seen == [("POST", "/v1/completions")]


async def test_two_byte_chunks_are_refused_once_they_count(
    server: SidecarServer, double: EngineDouble
) -> None:
    """A 4 MiB body in 2-byte chunks: a JSON 400 once FREE_CHUNKS of them have come, the
    connection closed; the engine never sees it."""
    answer = await exchange(server.proxy_port, CHUNKED_HEAD + chunked(completion(4 << 20), 2))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert b"Connection: close" in head
    error = json.loads(body)["error"]
    assert (error["code"], "too small" in error["message"]) == ("bad_body", True)
    assert double.seen == []
