"""Issue 48 row 9: an edge refusal says when the edge expects room, over real sockets: the
measured pace at which its holders go, or how long nothing has gone, never a flat second."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings
from tests.engine_double import EngineDouble, double
from tests.fake_time import FakeTime
from tests.servers import BASE_ENV, connected, until

__all__ = ["double"]

Start = Callable[..., Awaitable[SidecarServer]]

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
HELD = (
    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-double: held\r\n"
    f"Content-Type: application/json\r\nContent-Length: {len(CHAT)}\r\n\r\n{CHAT}"
).encode()
PLAIN = HELD.replace(b"x-double: held\r\n", b"")


@pytest.fixture
def time_() -> FakeTime:
    return FakeTime(now=1000.0)


@pytest.fixture
async def start(double: EngineDouble, time_: FakeTime) -> AsyncIterator[Start]:
    """Sidecars in front of the double, on the test's clock; stopped after."""
    started: list[SidecarServer] = []

    async def go(**env: str) -> SidecarServer:
        settings = load_settings({**BASE_ENV, "SIDECAR_UPSTREAM_URL": double.url, **env})
        server = SidecarServer(settings, clock=time_.clock)
        await server.start()
        started.append(server)
        return server

    yield go
    double.released.set()
    for server in started:
        await server.stop()


async def _answer_head(port: int, request: bytes) -> dict[str, str]:
    """The status and fields of the answer to ``request`` on a new connection."""
    async with connected(port) as (reader, writer):
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:] if line)
    return {"status": lines[0].split()[1], **{k.lower(): v for k, v in fields.items()}}


async def _gate_held(server: SidecarServer, held: bool) -> bool:
    return (server.gate.held > 0) == held


async def test_a_full_connection_cap_quotes_how_long_nothing_has_gone(
    start: Start, double: EngineDouble, time_: FakeTime
) -> None:
    """The port's one connection held by a running stream for 25 s: the next connection's 503
    says Retry-After: 25 (nothing went for that long), not 1."""
    server = await start(SIDECAR_MAX_CONNECTIONS="1")
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(HELD)
        await reader.readuntil(b"\r\n\r\n")  # the stream's head: its request runs
        time_.advance(25.0)
        refused = await _answer_head(server.proxy_port, PLAIN)
    assert (refused["status"], refused["retry-after"]) == ("503", "25")


async def test_the_gate_held_quotes_how_long_then_the_pace_of_frees(
    start: Start, double: EngineDouble, time_: FakeTime
) -> None:
    """The pre-admission gate held by a prompt count 40 s long: the next request's 503
    edge_busy says 40 s (retry-after-ms 40000, as the openai SDK reads it); once holders go
    every 2 s, it says 2."""
    server = await start(SIDECAR_MAX_PRE_ADMISSION="1", SIDECAR_PROMPT_TOKENS="engine")
    async with connected(server.proxy_port) as (_, writer):
        writer.write(HELD)  # its /tokenize is held: the gate's one slot with it
        assert await until(lambda: _gate_held(server, True))
        time_.advance(40.0)
        refused = await _answer_head(server.proxy_port, PLAIN)
    assert (refused["status"], refused["retry-after"]) == ("503", "40")
    assert (refused["retry-after-ms"], refused["x-should-retry"]) == ("40000", "true")
    assert await until(lambda: _gate_held(server, False))  # its client gone: the slot back
    for _ in range(15):  # 15 holders that go 2 s apart: the window's pace
        time_.advance(2.0)
        with server.gate:
            pass
    with server.gate:
        refused = await _answer_head(server.proxy_port, PLAIN)
    assert (refused["status"], refused["retry-after"]) == ("503", "2")
