"""An engine double for the edge's functional tests: it records every request it receives and
answers as the ``x-double`` header asks (endless SSE, a broken body, CRLF framing, paced events)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from tests.servers import serve_app

SSE = "text/event-stream"


@dataclass
class EngineDouble:
    """What reached the engine: (method, path_qs) per request, in order."""

    url: str = ""
    seen: list[tuple[str, str]] = field(default_factory=list)
    request_ids: list[str | None] = field(default_factory=list)  # each request's X-Request-Id
    # Mode "held": the head goes out at once, the events only once this is set.
    released: asyncio.Event = field(default_factory=asyncio.Event)
    # Mode "trickle": how each stream ended, "whole" or "cut" (the sidecar closed it first).
    trickles: list[str] = field(default_factory=list)

    def generating(self, free: frozenset[str] = frozenset({"/tokenize", "/detokenize"})) -> int:
        """Requests that needed a permit: every non-GET one off the free paths."""
        return sum(1 for method, path in self.seen if method != "GET" and path not in free)


async def _events(
    request: web.Request, events: list[bytes], gap_s: float = 0.0
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": SSE})
    await response.prepare(request)
    for event in events:
        if gap_s:
            await asyncio.sleep(gap_s)
        await response.write(event)
    await response.write_eof()
    return response


async def _endless(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": SSE})
    await response.prepare(request)
    event = b"data: " + b"x" * 65_536 + b"\n\n"
    # Bounded in time, not bytes: a fast relay moves 128 MiB in a tenth of a second, which would
    # end the stream inside a test's drain grace. 10 s is past every deadline the tests use.
    deadline = asyncio.get_running_loop().time() + 10.0
    while asyncio.get_running_loop().time() < deadline:
        await response.write(event)
        await asyncio.sleep(0)
    await response.write_eof()
    return response


async def _trickle(request: web.Request, double: EngineDouble) -> web.StreamResponse:
    """A decoding engine's pace: 1 KiB events 5 ms apart for about 4 s (800 KiB in all, less
    than a loopback socket's send buffer grows to), and how the stream ended, in ``trickles``."""
    response = web.StreamResponse(headers={"Content-Type": SSE})
    await response.prepare(request)
    ended = "cut"
    try:
        for event in numbered_events(800):
            await asyncio.sleep(0.005)
            await response.write(event)
        await response.write_eof()
        ended = "whole"
    finally:
        double.trickles.append(ended)
    return response


async def _broken(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(b'{"object": "list", "data": [')
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.abort()
    return response


def numbered_events(count: int = 3_000) -> list[bytes]:
    """``count`` SSE events of about 1 KiB, each carrying its number, then [DONE]."""
    pad = "x" * 1_000
    events = [f'data: {{"n": {i}, "pad": "{pad}"}}\n\n'.encode() for i in range(count)]
    return [*events, b"data: [DONE]\n\n"]


def _completion(request: web.Request, stream: bool) -> web.Response | list[bytes]:
    if stream:
        return [b'data: {"choices": [{"text": "hi"}]}\n\n', b"data: [DONE]\n\n"]
    body = {"object": "text_completion", "choices": [{"text": "hi"}], "usage": {"total_tokens": 2}}
    return web.json_response(body)


async def _held(request: web.Request, double: EngineDouble) -> web.StreamResponse:
    """A head, then nothing until the test sets ``double.released`` (an engine in prefill)."""
    response = web.StreamResponse(headers={"Content-Type": SSE})
    await response.prepare(request)
    await double.released.wait()
    await response.write(b"data: 1\n\ndata: [DONE]\n\n")
    await response.write_eof()
    return response


async def _one_write(request: web.Request, double: EngineDouble) -> web.StreamResponse:
    """Head, every event and the end in one write."""
    events = b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    return web.Response(body=events, headers={"Content-Type": SSE})


Mode = Callable[[web.Request, EngineDouble], Awaitable[web.StreamResponse]]
MODES: dict[str, Mode] = {
    "endless": lambda request, _double: _endless(request),
    "broken": lambda request, _double: _broken(request),
    # many numbered events, written as fast as the socket takes them
    "numbered": lambda request, _double: _events(request, numbered_events()),
    # a few, 5 ms apart, as a decoding engine sends them: each reaches the sidecar in a read of
    # its own, one whole chunk (the relay's shortcut)
    "paced": lambda request, _double: _events(request, numbered_events(20), gap_s=0.005),
    "crlf": lambda request, _double: _events(
        request, [b"data: 1\r\n\r\n", b"data: [DONE]\r\n\r\n"]
    ),
    "held": _held,
    "trickle": _trickle,
    "one_write": _one_write,
}


def _asks_to_stream(body: bytes) -> bool:
    """Whether a JSON object body says stream: true; any other body (a corpus vector's) does not."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


def build_double(double: EngineDouble) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        double.seen.append((request.method, request.raw_path))
        double.request_ids.append(request.headers.get("X-Request-Id"))
        body = await request.read()
        mode = MODES.get(request.headers.get("x-double", ""))
        if mode is not None:
            return await mode(request, double)
        if request.raw_path == "/tokenize":
            return web.json_response({"count": 3})
        stream = _asks_to_stream(body)
        answer = _completion(request, stream)
        return await _events(request, answer) if isinstance(answer, list) else answer

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@pytest.fixture
async def double() -> AsyncIterator[EngineDouble]:
    """The recording engine double on a free port."""
    recorder = EngineDouble()
    runner, recorder.url = await serve_app(build_double(recorder))
    yield recorder
    await runner.cleanup()
