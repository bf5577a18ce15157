"""Content encodings: the engine encodes only what the client accepts, and encoded streams pass
through byte for byte (an encoded SSE stream cannot be framed by event)."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.servers import StartSidecar, proxy_url, serve_app, sidecars

EVENTS = b"".join(b'data: {"choices":[{"index":0,"text":"t%d"}]}\n\n' % i for i in range(5))
EVENTS += b"data: [DONE]\n\n"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


class GzipEngine:
    """Streams SSE, gzip-encoded when the request accepts gzip; records what it was asked."""

    def __init__(self) -> None:
        self.accept_encoding: list[str | None] = []
        self.rest = asyncio.Event()  # set by the test once the first gzip bytes reached it

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        accept = request.headers.get("Accept-Encoding")
        self.accept_encoding.append(accept)
        encoded = "gzip" in (accept or "")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if encoded:
            response.headers["Content-Encoding"] = "gzip"
        await response.prepare(request)
        if not encoded:
            await response.write(EVENTS)
        else:  # the first event now (flushed), the rest once the client has seen it
            gz = zlib.compressobj(wbits=31)
            await response.write(gz.compress(EVENTS[:40]) + gz.flush(zlib.Z_SYNC_FLUSH))
            await self.rest.wait()
            await response.write(gz.compress(EVENTS[40:]) + gz.flush())
        await response.write_eof()
        return response


@pytest.fixture
async def gzip_engine() -> AsyncIterator[tuple[GzipEngine, StartSidecar]]:
    """The gzip-capable engine on a free port, and a starter of sidecars in front of it."""
    engine = GzipEngine()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", engine.handle)
    runner, url = await serve_app(app)
    async with sidecars(url) as start:
        yield engine, start
    await runner.cleanup()


async def test_the_engine_sees_only_the_clients_accept_encoding(
    gzip_engine: tuple[GzipEngine, StartSidecar],
) -> None:
    """A client that accepts no encoding gets plain SSE: the sidecar adds no Accept-Encoding."""
    engine, start = gzip_engine
    server = await start()
    async with (
        aiohttp.ClientSession(skip_auto_headers=("Accept-Encoding",)) as session,
        session.post(f"{proxy_url(server)}/v1/chat/completions", json=CHAT) as response,
    ):
        body = await response.read()
    assert engine.accept_encoding == [None]
    assert "Content-Encoding" not in response.headers
    assert body == EVENTS


async def test_a_gzip_stream_reaches_the_client_whole(
    gzip_engine: tuple[GzipEngine, StartSidecar],
) -> None:
    """A client that accepts gzip gets the engine's gzip stream as it comes, not held back to be
    framed by event (compressed bytes have no blank lines), and it decodes to every event."""
    engine, start = gzip_engine
    server = await start()
    headers = {"Accept-Encoding": "gzip"}
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(
            f"{proxy_url(server)}/v1/chat/completions", json=CHAT, headers=headers
        ) as response,
    ):
        first = await asyncio.wait_for(response.content.readany(), 5)
        engine.rest.set()
        body = first + await response.read()
    assert engine.accept_encoding == ["gzip"]
    assert response.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == EVENTS
