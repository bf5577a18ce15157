"""A Content-Length body in 1-byte TCP segments (Nagle off), the counterpart of row 5's tiny
chunks: llhttp hands over a body once per read, not once per byte, and the read floor rests a
connection whose reads are that small (tests/test_read_floor_functional.py), so its cost to the
loop is bounded; what ends such a body is the time it takes: the floor on its pace, else the body
deadline. Over real sockets, through the whole sidecar."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator

import pytest

from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import StartSidecar, sidecars

__all__ = ["double"]


@pytest.fixture
async def start(double: EngineDouble) -> AsyncIterator[StartSidecar]:
    async with sidecars(double.url) as start:
        yield start


def head(length: int) -> bytes:
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % length
    )


async def in_segments(
    server: SidecarServer, length: int, body: bytes, gap_s: float
) -> tuple[bytes, float, int]:
    """Send ``head(length)``, then ``body`` one byte per segment ``gap_s`` apart until an answer
    comes: the answer, the seconds from the head to it, and the body bytes sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    writer.write(head(length))
    started, sent = time.monotonic(), 0

    async def trickle() -> None:
        nonlocal sent
        for byte in body:
            writer.write(bytes([byte]))
            await writer.drain()
            sent += 1
            await asyncio.sleep(gap_s)

    trickling = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(10):
            answer = await reader.read()
        return answer, time.monotonic() - started, sent
    finally:
        trickling.cancel()
        await asyncio.gather(trickling, return_exceptions=True)
        writer.close()


async def test_a_body_in_one_byte_segments_that_keeps_pace_is_served(
    start: StartSidecar, double: EngineDouble
) -> None:
    """A completion's JSON, one byte per segment every 2 ms, at the defaults: 200, forwarded."""
    server = await start()
    body = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 4}).encode()
    answer, _seconds, sent = await in_segments(server, len(body), body, 0.002)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert sent == len(body)
    assert double.seen == [("POST", "/v1/completions")]


async def test_one_byte_segments_above_the_floor_end_at_the_body_deadline(
    start: StartSidecar, double: EngineDouble
) -> None:
    """A 1 MiB body in 1-byte segments, every 1 ms: over the floor (50 B/s here) it is never cut
    for its pace, and the body deadline ends it (408 ``body_timeout``), however many segments
    came; nothing reaches the engine."""
    server = await start(
        SIDECAR_BODY_TIMEOUT_MS="1000", SIDECAR_BODY_MIN_RATE="50",
        SIDECAR_BODY_RATE_GRACE_MS="400",
    )  # fmt: skip
    answer, seconds, sent = await in_segments(server, 1 << 20, b" " * (1 << 20), 0.001)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408"), answer[:200]
    assert json.loads(body)["error"]["code"] == "body_timeout"
    assert 0.9 <= seconds < 4.0
    assert sent > 50  # above the floor all along: the deadline, not the pace, ended it
    assert double.seen == []


async def test_one_byte_segments_under_the_floor_end_at_the_first_check(
    start: StartSidecar, double: EngineDouble
) -> None:
    """The same body a byte every 100 ms (10 B/s) under a 500 B/s floor: 408 once the first
    window is over, long before the 30 s deadline."""
    server = await start(SIDECAR_BODY_RATE_GRACE_MS="400")
    answer, seconds, _sent = await in_segments(server, 1 << 20, b" " * (1 << 20), 0.1)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert seconds < 3.0
    assert double.seen == []
