"""The read floor over real sockets, through the whole sidecar: a body sent one byte per TCP segment
(Nagle off) as fast as its client can makes its connection rest, so the loop reads it in a few
large reads instead of one per segment; the body still arrives and is served (slowed, not broken),
a rest is not counted as the client's slowness by the floor on its pace, and another client's
completion is answered meanwhile."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator

import pytest

from sidecar.edge.http.read_floor import REST_S
from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import StartSidecar, sidecars

__all__ = ["double"]

COMPLETION = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 4}).encode()


@pytest.fixture
async def start(double: EngineDouble) -> AsyncIterator[StartSidecar]:
    async with sidecars(double.url) as start:
        yield start


def rests(server: SidecarServer) -> int:
    """How many times the sidecar rested a connection of its proxy port."""
    count = server.proxy_connections
    assert count is not None
    return count.rests


def padded(size: int) -> bytes:
    """A completion's JSON, spaces after it up to ``size`` bytes: valid JSON, forwarded."""
    return COMPLETION + b" " * (size - len(COMPLETION))


def content_length(body: bytes) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )


def chunked(body: bytes, chunk: int) -> bytes:
    """``body`` in chunks of ``chunk`` bytes: chunks far over the chunk floor."""
    pieces = [body[at : at + chunk] for at in range(0, len(body), chunk)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n%s0\r\n\r\n" % framed
    )


def trickle(port: int, message: bytes, gap_s: float = 0.0, address: str = "127.0.0.1") -> bytes:
    """Send ``message`` one byte per segment (``gap_s`` apart; 0: as fast as the socket takes
    them) on a blocking socket, in a thread; the answer, read to the close."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=20, source_address=(address, 0)
    ) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for at in range(len(message)):
            s.send(message[at : at + 1])
            if gap_s:
                time.sleep(gap_s)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


def at_once(port: int) -> bytes:
    """A completion in one write, from 127.0.0.2."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=20, source_address=("127.0.0.2", 0)
    ) as s:
        s.sendall(content_length(COMPLETION))
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


async def sent_in_segments(
    server: SidecarServer, message: bytes, gap_s: float = 0.0
) -> tuple[bytes, float]:
    """``message`` trickled from a thread: the answer, and the CPU this thread (the sidecar's
    loop, and the engine double's) spent meanwhile, as a share of the time it took."""
    cpu, started = time.thread_time(), time.monotonic()
    answer = await asyncio.to_thread(trickle, server.proxy_port, message, gap_s)
    return answer, (time.thread_time() - cpu) / (time.monotonic() - started)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(content_length(padded(64 * 1024)), id="content-length"),
        pytest.param(chunked(padded(64 * 1024), 4096), id="chunked-4KiB-chunks"),
    ],
)
async def test_a_body_in_one_byte_segments_rests_and_is_served(
    start: StartSidecar, double: EngineDouble, message: bytes
) -> None:
    """64 KiB of body, a byte per segment as fast as a client can send them: the sidecar rests
    the connection (the kernel gathers the bytes), the loop spends a small share of the time
    reading them (about 1 %, where a read per segment took a third), and the completion is
    forwarded."""
    server = await start()
    answer, loop_share = await sent_in_segments(server, message)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert double.seen == [("POST", "/v1/completions")]
    assert rests(server) > 0
    assert loop_share < 0.1


async def test_a_rest_is_not_the_clients_slowness(
    start: StartSidecar, double: EngineDouble
) -> None:
    """A body a byte every 2 ms (up to 500 B/s) against a 50 B/s floor over a window shorter
    than a rest: each rest holds the client's bytes in the kernel for longer than the window,
    and they count as arrived, so the body is served, never answered 408. (At a 100 B/s floor
    it was answered 408 once in CI, its sending thread starved on a loaded machine.)"""
    server = await start(SIDECAR_BODY_MIN_RATE="50", SIDECAR_BODY_RATE_GRACE_MS="300")
    assert REST_S > 0.3  # the window is shorter than a rest: a check falls inside one
    answer, _share = await sent_in_segments(server, content_length(padded(1500)), gap_s=0.002)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert rests(server) > 0
    assert double.seen == [("POST", "/v1/completions")]


async def test_a_completion_is_answered_while_bodies_trickle(
    start: StartSidecar, double: EngineDouble
) -> None:
    """Four clients each send 64 KiB of body a byte per segment as fast as they can; a
    completion from another address meanwhile is answered, and so is each of theirs."""
    server = await start(SIDECAR_KV_POOL=str(8 * 131_072))  # room for all five at once
    tricklers = [
        asyncio.create_task(
            asyncio.to_thread(trickle, server.proxy_port, content_length(padded(64 * 1024)))
        )
        for _ in range(4)
    ]
    await asyncio.sleep(0.2)
    legit = await asyncio.to_thread(at_once, server.proxy_port)
    assert legit.startswith(b"HTTP/1.1 200"), legit[:200]
    answers = await asyncio.gather(*tricklers)
    assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers), [a[:40] for a in answers]
    assert rests(server) >= 4
