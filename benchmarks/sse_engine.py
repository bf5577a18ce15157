"""A stand-in engine that streams vLLM-shaped SSE as fast as one core allows, for the relay bench.

Raw asyncio protocol, no framework: HTTP/1.1 keep-alive, ``GET /health`` answers 200, any POST
answers one chat stream of ``--events`` token events (or as many as its ``x-bench-events``
field asks for; bytes built once per length, by the emulator's own chunk builders, so they look
like vLLM's) in chunked encoding, one write per event, yielding to the loop between events so
concurrent streams interleave as an engine's batches do. It exists
because the emulator prices KV blocks and paces tokens per request, and would be the bottleneck.

Run: ``python -m benchmarks.sse_engine --port 8000 --events 64``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import sys
from collections.abc import Sequence
from typing import cast

from benchmarks.loops import run
from emulator.sse import DONE, Stream, role_chunk, token_chunk

HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
HEALTH = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
HEALTH_HEAD = HEALTH[: HEALTH.index(b"\r\n\r\n") + 4]  # the answer to a HEAD: no body
END = b"0\r\n\r\n"
# A request carrying this field is paced: one event every so many ms after the first (lower case:
# the head is matched lowered). Stands for an engine decoding at a real rate.
GAP_FIELD = b"x-bench-gap-ms:"
# And this one asks for so many token events instead of ``--events``.
EVENTS_FIELD = b"x-bench-events:"


@functools.cache
def stream_events(count: int) -> tuple[bytes, ...]:
    """The role event, ``count`` token events and [DONE], each framed as one HTTP chunk."""
    stream = Stream("chat", "chatcmpl-bench", 1_700_000_000, "bench")
    events = [role_chunk(stream)]
    events += [token_chunk(stream, f" tok{i}") for i in range(count - 1)]
    events += [token_chunk(stream, " end", "length", last=True), DONE]
    return tuple(b"%x\r\n%s\r\n" % (len(event), event) for event in events)


class EngineProtocol(asyncio.Protocol):
    """One client connection; requests are served one after another, as HTTP/1.1 requires."""

    def __init__(self, events: Sequence[bytes]) -> None:
        self._events = events
        self._buffer = b""
        self._transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._busy:
            self._next()

    def _next(self) -> None:
        head_end = self._buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self._buffer[:head_end].lower()
        length = 0
        if (at := head.find(b"content-length:")) >= 0:
            length = int(head[at + 15 :].split(b"\r\n", 1)[0])
        if len(self._buffer) < head_end + 4 + length:
            return
        self._buffer = self._buffer[head_end + 4 + length :]
        if head.startswith((b"get", b"head")):  # any GET is the health check; HEAD: no body
            self._write(HEALTH if head.startswith(b"get") else HEALTH_HEAD)
            self._next()
            return
        gap_s = _field(head, GAP_FIELD, 0.0) / 1e3
        events = self._events
        if (count := int(_field(head, EVENTS_FIELD, 0))) > 0:
            events = stream_events(count)
        self._busy = True
        asyncio.get_running_loop().create_task(self._stream(events, gap_s))

    def _write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    async def _stream(self, events: Sequence[bytes], gap_s: float) -> None:
        self._write(HEADERS)
        for i, event in enumerate(events):
            await asyncio.sleep(gap_s if i else 0)
            if not self._writable.is_set():
                await self._writable.wait()
            if self._transport is None:
                return
            self._write(event)
        self._write(END)
        self._busy = False
        self._next()


def _field(head: bytes, name: bytes, default: float) -> float:
    """The number in the field ``name`` (lower case) of a lowered request head, else ``default``."""
    at = head.find(name)
    return float(head[at + len(name) :].split(b"\r\n", 1)[0]) if at >= 0 else default


async def serve(port: int, events: int) -> None:
    loop = asyncio.get_running_loop()
    frames = stream_events(events)
    server = await loop.create_server(
        lambda: EngineProtocol(frames), "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--events", type=int, default=64)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        run(serve(args.port, args.events))
    return 0


if __name__ == "__main__":
    sys.exit(main())
