"""A broken engine answer, over real sockets: a clean 502 before the answer starts, the in-band
error once a stream has, at once (never after the read timeout), the permit back, and never a
byte of the engine's in what the client gets."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from sidecar.entry.app import SidecarServer
from tests.servers import admin_url, error_of, get_json, proxy_url, sidecars, sse_events

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
# In every scripted answer: bytes the client must never see.
MARK = b"ENGINE-BYTES-7f3a"
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
FIRST = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
# Long enough that a sidecar waiting for more of a broken answer fails the test's own bound.
READ_TIMEOUT_MS = "30000"
BOUND_S = 5.0


@dataclass
class RawEngine:
    """An engine that answers each request with the next of ``script`` (then ``answer``), byte
    for byte, and ``then`` once ``go`` is set; it keeps the connection for the next request.
    ``HANG_UP`` answers by closing the connection. A parser that waits for more than an answer
    holds would wait for the read timeout."""

    answer: bytes = b""
    script: list[bytes] = field(default_factory=list)
    then: bytes = b""
    go: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    requests: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                await _read_request(reader)
                self.requests += 1
                answer = self.script.pop(0) if self.script else self.answer
                if answer == HANG_UP:
                    writer.close()
                    return
                writer.write(answer)
                await writer.drain()
                if self.then:
                    await self.go.wait()
                    writer.write(self.then)


HANG_UP = b"<hang up>"


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    await reader.readexactly(length)


@pytest.fixture
async def raw_engine() -> AsyncIterator[RawEngine]:
    engine = RawEngine()
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.port = server.sockets[0].getsockname()[1]
    yield engine
    for writer in engine.writers:
        writer.close()
    server.close()


@pytest.fixture
async def sidecar(raw_engine: RawEngine) -> AsyncIterator[SidecarServer]:
    async with sidecars(f"http://127.0.0.1:{raw_engine.port}") as start:
        yield await start(SIDECAR_UPSTREAM_READ_TIMEOUT_MS=READ_TIMEOUT_MS)


async def _in_use(server: SidecarServer) -> int:
    return int((await get_json(f"{admin_url(server)}/capacity"))["in_use"])


async def _post(server: SidecarServer, *, stream: bool) -> tuple[int, dict[str, str], bytes]:
    """Status, fields and whole body of one chat completion, bounded well under the read
    timeout."""
    async with (
        asyncio.timeout(BOUND_S),
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy_url(server)}/v1/chat/completions", json={**CHAT, "stream": stream}
        ) as response,
    ):
        return response.status, dict(response.headers), await response.read()


BROKEN_HEADS = [
    pytest.param(SSE_HEAD.replace(b"\r\n", b"\n") + b"\n", id="bare-lf-head"),
    pytest.param(SSE_HEAD + b"X-A: " + MARK + b"\nX-B: 2\r\n\r\n", id="bare-lf-in-a-field"),
    pytest.param(SSE_HEAD + b"X-A: " + MARK + b"\rX-B: 2\r\n\r\n", id="bare-cr-in-a-field"),
    pytest.param(SSE_HEAD + b"X-A: " + MARK + b"\x00\r\n\r\n", id="nul-in-a-field"),
    pytest.param(SSE_HEAD + b"X-A: \x1b[31m" + MARK + b"\r\n\r\n", id="escape-in-a-field"),
    pytest.param(b"HTTP/1.1 200 " + MARK + b"\x00\r\n\r\n", id="nul-in-the-reason"),
    pytest.param(MARK + b" 200 OK\r\n\r\n", id="not-http"),
    pytest.param(b"HTTP/1.1 200 OK\r\n" + MARK + b"\r\n\r\n", id="field-without-colon"),
    pytest.param(b"HTTP/1.1 099 Weird\r\nX-A: " + MARK + b"\r\n\r\n", id="status-099"),
    pytest.param(b"HTTP/1.1 000 Zero\r\nContent-Length: 0\r\n\r\n", id="status-000"),
    pytest.param(b"HTTP/1.1 600 Past\r\nContent-Length: 0\r\n\r\n", id="status-600"),
    pytest.param(b"HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n", id="status-999"),
    pytest.param(
        SSE_HEAD.replace(b"chunked", b"gzip, chunked") + b"\r\n" + FIRST, id="gzip-chunked"
    ),
    pytest.param(SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + FIRST, id="chunked-twice"),
    pytest.param(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nX-A: " + MARK + b"\r\n\r\n" + MARK,
        id="gzip-to-close",
    ),
    pytest.param(
        SSE_HEAD.replace(b"chunked", b"identity, chunked") + b"\r\n" + FIRST,
        id="identity-chunked",
    ),
]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("answer", BROKEN_HEADS)
async def test_a_broken_head_is_a_clean_502_at_once(
    raw_engine: RawEngine, sidecar: SidecarServer, answer: bytes, stream: bool
) -> None:
    """Before the answer starts: a 502 with an OpenAI-shaped body, no engine byte in it, no
    engine field passed on, the permit back, and no wait for the read timeout."""
    raw_engine.answer = answer
    status, headers, body = await _post(sidecar, stream=stream)
    assert status == 502
    assert error_of(body)["code"] == "upstream_unavailable"
    assert MARK not in body
    assert "X-A" not in headers
    assert raw_engine.requests == 1
    assert await _in_use(sidecar) == 0


BROKEN_BODIES = [
    pytest.param(b"5\nhello\r\n", id="bare-lf-size-line"),
    pytest.param(b"5\r\nhello\n", id="bare-lf-after-data"),
    pytest.param(b"zz\r\n" + MARK + b"\r\n", id="not-a-size"),
    pytest.param(b"2\r\n" + MARK + b"\r\n", id="chunk-overrun"),
]


@pytest.mark.parametrize("tail", BROKEN_BODIES)
async def test_broken_framing_mid_stream_ends_it_in_band_at_once(
    raw_engine: RawEngine, sidecar: SidecarServer, tail: bytes
) -> None:
    """Once the 200 and a first event reached the client: the in-band error event then
    [DONE], at once, the permit back, no engine byte past the good event."""
    raw_engine.answer, raw_engine.then = SSE_HEAD + b"\r\n" + FIRST, tail
    url = f"{proxy_url(sidecar)}/v1/chat/completions"
    async with (
        asyncio.timeout(BOUND_S),
        aiohttp.ClientSession() as session,
        session.post(url, json={**CHAT, "stream": True}) as response,
    ):
        assert response.status == 200
        first = await response.content.readuntil(b"\n\n")
        raw_engine.go.set()  # the stream has started: now the engine's framing breaks
        rest = await response.read()
    assert first == EVENT
    events = sse_events(rest)
    assert json.loads(events[0][1])["error"]["code"] == "upstream_unavailable"
    assert events[1:] == [(None, "[DONE]")]
    assert MARK not in rest
    assert await _in_use(sidecar) == 0


@pytest.mark.parametrize("tail", BROKEN_BODIES)
async def test_broken_framing_in_the_heads_read_is_a_clean_502(
    raw_engine: RawEngine, sidecar: SidecarServer, tail: bytes
) -> None:
    """Where the break comes with the head, nothing has gone to the client yet: a 502."""
    raw_engine.answer = SSE_HEAD + b"\r\n" + FIRST + tail
    status, _, body = await _post(sidecar, stream=True)
    assert status == 502
    assert error_of(body)["code"] == "upstream_unavailable"
    assert MARK not in body
    assert await _in_use(sidecar) == 0


async def test_a_broken_head_after_a_good_answer_never_reuses_the_connection(
    raw_engine: RawEngine, sidecar: SidecarServer
) -> None:
    """The next request after a broken answer opens its own connection and is answered."""
    raw_engine.answer = SSE_HEAD + b"X-A: a\x00b\r\n\r\n"
    assert (await _post(sidecar, stream=True))[0] == 502
    raw_engine.answer = SSE_HEAD + b"\r\n" + FIRST + b"0\r\n\r\n"
    status, _, body = await _post(sidecar, stream=True)
    assert (status, sse_events(body)) == (200, [(None, EVENT.decode()[6:].strip())])
    assert len(raw_engine.writers) == 2


async def test_a_post_the_engine_may_have_seen_is_never_sent_again(
    raw_engine: RawEngine, sidecar: SidecarServer
) -> None:
    """RFC 9112 §9.3.1: the engine hangs up on a kept-alive connection as the next POST goes
    out on it. It may be generating for it: the client gets a 502 and the engine saw it once;
    the permit comes back, and the next request is answered on a new connection."""
    done = SSE_HEAD + b"\r\n" + FIRST + b"0\r\n\r\n"
    raw_engine.script = [done, HANG_UP, done]
    assert (await _post(sidecar, stream=True))[0] == 200
    status, _, body = await _post(sidecar, stream=True)
    assert (status, error_of(body)["code"]) == (502, "upstream_unavailable")
    assert raw_engine.requests == 2
    assert await _in_use(sidecar) == 0
    assert (await _post(sidecar, stream=True))[0] == 200
    assert (raw_engine.requests, len(raw_engine.writers)) == (3, 2)
