"""A lean SSE load client for the relay bench: raw asyncio streams, HTTP/1.1 keep-alive.

``concurrency`` connections each send one streaming chat request after another until the time is
up (and at most ``max_streams`` in all). A stream counts only if it ended with ``[DONE]`` and the
chunked terminator; TTFT is the time from the request's last byte out to the first ``data:`` in.
It parses nothing else, so it stays cheap next to what it measures.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

TERMINATOR = b"0\r\n\r\n"
HOST = "127.0.0.1"


def chat_request(
    host: str, port: int, max_tokens: int, gap_ms: float = 0.0, events: int = 0
) -> bytes:
    """A streaming chat request; ``gap_ms`` asks the bench engine to pace its events, ``events``
    (where not 0) for that many token events."""
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "benchmark"}],
            "stream": True,
            "max_tokens": max_tokens,
        }
    ).encode()
    pace = f"x-bench-gap-ms: {gap_ms:g}\r\n" if gap_ms else ""
    pace += f"x-bench-events: {events}\r\n" if events else ""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n{pace}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class LoadResult:
    """What one load run saw: completed streams, their TTFTs (s), failures, wall time (s)."""

    streams: int = 0
    failures: int = 0
    elapsed_s: float = 0.0
    ttfts_s: list[float] = field(default_factory=list)


class BrokenStreamError(Exception):
    """The response was not a complete 200 stream."""


async def one_stream(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> float:
    """Send one request, read its stream to the end; the TTFT in seconds."""
    writer.write(request)
    sent = time.perf_counter()
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise BrokenStreamError(head[:80])
    ttft, tail = 0.0, head[-32:]
    while True:
        data = await reader.read(65536)
        if not data:
            raise BrokenStreamError("connection closed mid-stream")
        if not ttft and b"data: " in data:
            ttft = time.perf_counter() - sent
        tail = (tail + data)[-32:]
        if tail.endswith(TERMINATOR):
            if b"[DONE]" not in tail:
                raise BrokenStreamError("stream ended without [DONE]")
            return ttft


@dataclass
class _Plan:
    port: int
    request: bytes
    deadline: float
    left: int
    result: LoadResult


async def _worker(plan: _Plan, delay_s: float) -> None:
    reader, writer = await asyncio.open_connection(HOST, plan.port)
    await asyncio.sleep(delay_s)
    try:
        while time.perf_counter() < plan.deadline and plan.left > 0:
            plan.left -= 1
            try:
                plan.result.ttfts_s.append(await one_stream(reader, writer, plan.request))
            except (BrokenStreamError, asyncio.IncompleteReadError, OSError):
                plan.result.failures += 1
                writer.close()
                reader, writer = await asyncio.open_connection(HOST, plan.port)
                continue
            plan.result.streams += 1
    finally:
        writer.close()


async def load(
    port: int,
    *,
    concurrency: int,
    seconds: float,
    max_streams: int,
    max_tokens: int,
    gap_ms: float = 0.0,
    stagger_s: float = 0.0,
) -> LoadResult:
    """Run ``concurrency`` streams at a time against 127.0.0.1:``port`` for ``seconds``.

    ``gap_ms``: paced streams (the bench engine spaces its events). ``stagger_s``: the workers'
    first requests spread evenly over that time, so paced streams do not start (and end) in step.
    """
    started = time.perf_counter()
    request = chat_request(HOST, port, max_tokens, gap_ms)
    plan = _Plan(port, request, started + seconds, max_streams, LoadResult())
    delays = [i * stagger_s / concurrency for i in range(concurrency)]
    await asyncio.gather(*(_worker(plan, delay) for delay in delays))
    plan.result.elapsed_s = time.perf_counter() - started
    return plan.result
