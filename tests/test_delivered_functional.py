"""A stream whose end reached its client is completed, whoever closes the connection first.

The openai SDK closes the moment it reads ``data: [DONE]``; the engine's own end of the body
(the chunked terminator) may come after that. Here an engine holds its terminator back until the
test lets it go, so the client's close always comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from sidecar.entry.app import SidecarServer
from tests.servers import (
    OpenAIFactory,
    StartSidecar,
    admin_url,
    proxy_url,
    scrape,
    serve_app,
    sidecars,
    until,
)

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "stream": True}
CHUNK = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "a"}}]}


class LateEnd:
    """An engine that sends a stream's first chunk, then its ``[DONE]`` once ``done`` is set,
    then holds the body's end until ``release`` is set."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.done.set()
        self.release = asyncio.Event()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(CHUNK)}\n\n".encode())
        await self.done.wait()
        await response.write(b"data: [DONE]\n\n")
        await self.release.wait()
        with contextlib.suppress(ConnectionResetError):  # the sidecar may have closed its side
            await response.write_eof()
        return response


@pytest.fixture
async def late_end() -> AsyncIterator[tuple[LateEnd, StartSidecar]]:
    engine = LateEnd()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine.chat)
    runner, url = await serve_app(app)
    try:
        async with sidecars(url) as start:
            yield engine, start
    finally:
        engine.done.set()
        engine.release.set()
        await runner.cleanup()


async def read_to_done_and_close(server: SidecarServer) -> bytes:
    """A client that hangs up the moment it has read ``data: [DONE]``, as the SDK does."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    body = json.dumps(CHAT).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"
        b"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    received = await asyncio.wait_for(reader.readuntil(b"data: [DONE]"), 5)
    writer.close()
    await writer.wait_closed()
    return received


async def _released(server: SidecarServer) -> bool:
    return sum(server.bulkhead.snapshot().released.values()) == 1


async def test_a_client_that_closes_on_done_leaves_a_completed_stream(
    late_end: tuple[LateEnd, StartSidecar],
) -> None:
    """The client reads [DONE] and closes before the engine's body ends: the permit is released
    completed and the request counted completed, not client_gone."""
    _engine, start = late_end
    server = await start()
    received = await read_to_done_and_close(server)
    assert received.startswith(b"HTTP/1.1 200")
    assert await until(lambda: _released(server))
    assert server.bulkhead.snapshot().released == {"completed": 1}
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics.get("sidecar_requests_total{outcome=completed}") == 1
    assert metrics["sidecar_requests_total{outcome=client_gone}"] == 0


async def test_a_client_gone_before_done_is_still_client_gone(
    late_end: tuple[LateEnd, StartSidecar],
) -> None:
    """A client that leaves before the end reached it is not counted as served."""
    engine, start = late_end
    engine.done.clear()
    server = await start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    body = json.dumps(CHAT).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: sidecar\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    await asyncio.wait_for(reader.readuntil(b"chat.completion.chunk"), 5)
    writer.close()
    await writer.wait_closed()
    assert await until(lambda: _released(server))
    assert server.bulkhead.snapshot().released == {"cancelled": 1}
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_requests_total{outcome=client_gone}"] == 1


async def test_sdk_streams_read_to_the_end_are_all_completed(
    start_sidecar: StartSidecar, openai_client: OpenAIFactory
) -> None:
    """Twenty SDK streams, each read to [DONE] and closed by the SDK: twenty completed."""
    server = await start_sidecar(SIDECAR_MAX_QUEUE="32")
    client = openai_client(proxy_url(server))

    async def one() -> None:
        stream = await client.chat.completions.create(**CHAT, max_tokens=4)  # type: ignore[call-overload]
        async for _chunk in stream:
            pass

    await asyncio.gather(*(one() for _ in range(20)))
    assert await until(lambda: _all_released(server, 20))
    assert server.bulkhead.snapshot().released == {"completed": 20}


async def _all_released(server: SidecarServer, n: int) -> bool:
    return sum(server.bulkhead.snapshot().released.values()) == n
