"""Relaying the engine's answer to the client, chunk by chunk, with no buffering or parsing.

When the engine fails after the 200 went out, an SSE stream is ended in-band the way vLLM reports
its own mid-stream errors (``data: {"error": ...}`` then ``data: [DONE]``) so SDKs raise a clear
error instead of choking on a truncated body; any other body is cut off (the connection is
aborted, no terminating chunk), so the client sees an error, never a clean truncated 200.

Every write to the client has a deadline: a client that stops reading ends its stream
(``client_stalled``) instead of holding its permit. While a request waits for a permit, the
deadline is the shorter stall (:class:`ClientStall`): a stream whose client has not taken a
write that long gives its place up, since the engine it holds cannot go on while nobody reads
(82 slow readers of long answers, each reading 64 B/s, held every place for the 30 s write
deadline, reconnected, and no other request got in). A drain that ran out of grace stops the relay
through its :class:`Stop`; the stream then ends in-band with ``draining``.

A stream whose end reached the client (an SSE stream's ``data: [DONE]``, any other body's last
byte) is ``completed``, whoever closes first: the openai SDK closes the moment it reads
``[DONE]``, often before the engine's own end of the body has come in.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from sidecar.core.admission.ledger import StreamUsage
from sidecar.core.errors import UpstreamError
from sidecar.core.outcomes import REJECTIONS, Refusal, RelayEnd, refusal_body
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.edge.engine.client import read_chunk
from sidecar.edge.engine.pool import EngineResponse
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import StreamResponse
from sidecar.edge.proxy.in_flight import Stop
from sidecar.edge.proxy.sse_framing import EventFramer, ends_with_done

# One per choice object of an OpenAI stream chunk: a token event (the usage chunk has none).
TOKEN_MARK = b'"index":'
# Writing our own last words (an in-band error) never waits longer than this.
LAST_WORDS_S = 0.5
# Room kept below the socket's high-water mark for chunk framing and the response head.
HEADROOM = 16 * 1024


@dataclass(frozen=True, slots=True)
class ClientStall:
    """How long a write may wait on its client (``after_s``) while a request waits for a permit
    (``contended``): past it the stream ends ``client_stalled`` and its place is given up."""

    contended: Callable[[], bool]
    after_s: float


@dataclass(frozen=True, slots=True)
class RelayResult:
    """How a relay ended."""

    end: RelayEnd
    response: StreamResponse
    error: UpstreamError | None = None


def in_band(refusal: Refusal, message: str) -> bytes:
    """The SSE tail that ends a stream early."""
    return f"data: {json.dumps(refusal_body(refusal, message))}\n\ndata: [DONE]\n\n".encode()


def in_band_error(exc: UpstreamError) -> bytes:
    """The SSE tail that ends a broken stream."""
    return in_band(exc.refusal, str(exc))


def response_for(upstream: EngineResponse, request_id: str) -> StreamResponse:
    """The client's answer. Where body bytes came in the same read as the engine's head, the
    client's head leaves with them, in one write; where the engine sent its head alone (vLLM
    before its first token), the client gets the head at once too."""
    response = StreamResponse(upstream.status, upstream.reason, head_with_body=upstream.ready())
    response.headers.extend(upstream.forwarded)
    response.headers["X-Request-Id"] = request_id
    return response


@dataclass(slots=True, kw_only=True)
class _Relay:
    request: Request
    response: StreamResponse
    write_timeout_s: float
    framer: EventFramer | None  # an SSE stream's: passes on whole events only
    tally: StreamUsage | None = None  # adaptive admission: the token events relayed
    timing: StreamTiming | None = None  # when the token events were relayed
    clock: Callable[[], float] = time.monotonic
    upstream: EngineResponse | None = None  # a body that is not SSE: read for its end
    room: int = 0  # what the client's buffer may hold with no wait: its high-water less HEADROOM
    delivered: bool = False  # the stream's end was written to the client
    stall: ClientStall | None = None  # a shorter wait on the client while others wait

    def __post_init__(self) -> None:
        self.room = self.request.transport.get_write_buffer_limits()[1] - HEADROOM

    @property
    def sse(self) -> bool:
        return self.framer is not None

    def _fits(self, size: int) -> bool:
        """Whether writing ``size`` bytes stays below the high-water mark, so the connection is
        never paused on a drain: such a write needs no deadline. Never while writing is paused
        (the buffer may be back under the mark and over the low one): a write then waits."""
        request = self.request
        if request.wire.paused:
            return False
        return request.transport.get_write_buffer_size() + size <= self.room

    def ready(self, chunk: bytes) -> bytes:
        """What of the engine's ``chunk`` goes out now (whole events), counted."""
        return self.counted(self.framer.feed(chunk) if self.framer is not None else chunk)

    def counted(self, chunk: bytes) -> bytes:
        """``chunk``, its token events added to the tally (adaptive admission) and stamped on
        the timing (one clock read per chunk that carries any)."""
        if chunk and (self.tally is not None or self.timing is not None):
            tokens = chunk.count(TOKEN_MARK)
            if self.tally is not None:
                self.tally.relayed += tokens
            if tokens and self.timing is not None:
                self.timing.saw(tokens, self.clock())
        return chunk

    def push(self, chunk: bytes) -> bool:
        """The engine connection's sink: relay ``chunk`` from the socket's callback, where that
        needs no wait. It declines (False, nothing consumed) when the client is gone or the write
        could fill its buffer; the relay task then writes it, under the write deadline."""
        request = self.request
        if request.wire.lost or request.transport.is_closing() or not self._fits(len(chunk)):
            return False
        out = self.ready(chunk)
        self.response.write_now(out)
        self.sent(out)
        return True

    def sent(self, chunk: bytes) -> None:
        """``chunk`` was written to the client: note whether the stream's end went with it."""
        if self.delivered or not chunk:
            return
        if self.framer is not None:
            self.delivered = ends_with_done(chunk)
        else:
            self.delivered = self.upstream is not None and self.upstream.is_eof()

    def ended(self, end: RelayEnd | None) -> RelayEnd:
        """How the relay ended, ``end`` (None: the body's end written): a client that left once
        the stream's end had reached it leaves a completed stream."""
        if end is None or (end == "client_gone" and self.delivered):
            return "completed"
        return end

    async def write(self, data: bytes, timeout_s: float | None = None) -> RelayEnd | None:
        """Write with a deadline, in pieces no larger than the client's room (each waiting for
        it), so that its buffer never holds much more than its high-water mark; the relay's
        end if the client is gone or stalled."""
        step = max(self.room, HEADROOM)
        for at in range(0, len(data), step):
            piece = data[at : at + step]
            if end := await self._deadlined(self.response.write(piece), len(piece), timeout_s):
                return end
        return None

    async def prepare(self) -> RelayEnd | None:
        """Send the status line and headers, under the same deadline as a write."""
        return await self._deadlined(self.response.prepare(self.request), 0, None)

    async def end_body(self, last: bytes = b"") -> RelayEnd | None:
        """End the body with its ``last`` bytes (and the terminating chunk) in one write, under
        the same deadline as a write."""
        return await self._deadlined(self.response.write_eof(last), len(last), None)

    async def _deadlined(
        self, io: Coroutine[Any, Any, object], size: int, timeout_s: float | None
    ) -> RelayEnd | None:
        try:
            if self._fits(size):
                await io
            else:
                await self._wait_for_client(io, timeout_s or self.write_timeout_s)
        except ConnectionResetError:
            return "client_gone"
        except TimeoutError:
            self.abort()
            return "client_stalled"
        return None

    async def _wait_for_client(self, io: Coroutine[Any, Any, object], timeout_s: float) -> None:
        """Wait for a write the client must drain first, ``timeout_s`` at most; TimeoutError
        past it, or past the stall's ``after_s`` (then each ``after_s`` after) found with a
        request waiting for a permit (:class:`ClientStall`)."""
        stall = self.stall
        if stall is None or stall.after_s >= timeout_s:
            async with asyncio.timeout(timeout_s):
                await io
            return
        write = asyncio.ensure_future(io)
        try:
            waited = 0.0
            while True:
                step = min(stall.after_s, timeout_s - waited)
                done, _ = await asyncio.wait((write,), timeout=step)
                if done:
                    write.result()
                    return
                waited += step
                if waited >= timeout_s or stall.contended():
                    raise TimeoutError
        finally:
            write.cancel()

    def abort(self) -> None:
        """Drop the client's connection at once, without a terminating chunk."""
        self.request.transport.abort()


async def relay_stream(
    request: Request,
    upstream: EngineResponse,
    request_id: str,
    *,
    write_timeout_s: float,
    stop: Stop | None = None,
    tally: StreamUsage | None = None,
    timing: StreamTiming | None = None,
    clock: Callable[[], float] = time.monotonic,
    stall: ClientStall | None = None,
) -> RelayResult:
    """Copy the engine's body to the client as it arrives.

    Each read of the engine's runs through the engine connection's callback (``_Relay.push``):
    one framing scan for SSE, one write, no task woken. The task waits for the end, an error, or
    a chunk that must wait for the client (it writes that one, under the write deadline). With a
    ``tally`` (adaptive admission), one ``bytes.count`` per chunk adds the token events relayed;
    with a ``timing``, ``clock`` stamps the chunks that carry them. A write waits on its client
    no longer than the ``stall`` allows while a request waits for a permit.
    """
    response = response_for(upstream, request_id)
    # An encoded (e.g. gzip) stream cannot be framed or ended in-band: its bytes pass as they are.
    encoding = upstream.headers.get("Content-Encoding", "identity").strip().lower()
    sse = upstream.content_type == "text/event-stream" and encoding == "identity"
    framer, timing = (EventFramer(), timing) if sse else (None, None)
    relay = _Relay(
        request=request,
        response=response,
        write_timeout_s=write_timeout_s,
        framer=framer,
        tally=tally,
        timing=timing,
        clock=clock,
        upstream=None if sse else upstream,
        stall=stall,
    )
    if (end := await relay.prepare()) is not None:
        return RelayResult(end, response)
    try:
        return await _copy(relay, upstream)
    except asyncio.CancelledError:
        if relay.delivered and request.wire.lost:
            return _delivered(relay)
        if stop is None or not stop.claim():
            raise
        return await _stopped(relay)


def _delivered(relay: _Relay) -> RelayResult:
    """The client hung up (its handler cancelled) after its stream's end reached it: all that
    was left was waiting for the engine's end of the body, so the cancel is absorbed and the
    stream is completed."""
    task = asyncio.current_task()
    assert task is not None, "a relay runs in its handler's task"
    task.uncancel()
    return RelayResult("completed", relay.response)


async def _copy(relay: _Relay, upstream: EngineResponse) -> RelayResult:
    response, push = relay.response, relay.push
    try:
        while True:
            upstream.push_to(push)
            try:
                chunk = await read_chunk(upstream)
            except UpstreamError as exc:
                return await _end_broken(relay, exc)
            if not chunk:
                last = b""
                break
            chunk = relay.ready(chunk)
            if upstream.is_eof():  # the body ended in this read: its last bytes go with the end
                last = chunk
                break
            if chunk:
                if (end := await relay.write(chunk)) is not None:
                    return RelayResult(relay.ended(end), response)
                relay.sent(chunk)
    finally:
        upstream.push_to(None)  # before anything else is written, and before the pool has it
    if relay.framer is not None:
        last += relay.counted(relay.framer.flush())
    if not last and not relay.sse:
        relay.delivered = True  # every byte of the body is out: only its framing's end is left
    return RelayResult(relay.ended(await relay.end_body(last)), response)


async def _end_broken(relay: _Relay, exc: UpstreamError) -> RelayResult:
    if not relay.sse:
        relay.abort()
        return RelayResult("upstream_failed", relay.response, exc)
    end = await relay.write(in_band_error(exc), LAST_WORDS_S) or await relay.end_body()
    if end is not None:
        return RelayResult(end, relay.response, exc)
    return RelayResult("upstream_failed", relay.response, exc)


async def _stopped(relay: _Relay) -> RelayResult:
    """The drain's grace ran out: end an SSE stream in-band, cut off any other body."""
    if not relay.sse:
        relay.abort()
        return RelayResult("stopped", relay.response)
    draining = REJECTIONS["draining"]
    relay.write_timeout_s = LAST_WORDS_S
    if await relay.write(in_band(draining, draining.message)) is None:
        await relay.end_body()
    return RelayResult("stopped", relay.response)
