"""Relaying the engine's answer to the client, chunk by chunk, with no buffering or parsing.

When the engine fails after the 200 went out, an SSE stream is ended in-band the way vLLM reports
its own mid-stream errors (``data: {"error": ...}`` then ``data: [DONE]``) so SDKs raise a clear
error instead of choking on a truncated body.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Literal

import aiohttp
from aiohttp import web

from sidecar.core.errors import UpstreamError
from sidecar.core.ledger import StreamUsage
from sidecar.edge.engine_client import end_to_end, read_chunk
from sidecar.edge.http_errors import refusal_body

RelayEnd = Literal["completed", "client_gone", "upstream_failed"]

# One per choice object of an OpenAI stream chunk: a token event (the usage chunk has none).
TOKEN_MARK = b'"index":'


@dataclass(frozen=True)
class RelayResult:
    """How a relay ended."""

    end: RelayEnd
    response: web.StreamResponse
    error: UpstreamError | None = None


def in_band_error(exc: UpstreamError) -> bytes:
    """The SSE tail that ends a broken stream."""
    body = refusal_body(exc.refusal, str(exc))
    return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()


class EventFramer:
    """Passes on whole SSE events only, holding back a partial one until its end arrives.

    Complete events go out the moment they arrive (nothing is batched); only the bytes of an event
    whose blank line has not come yet wait. If the engine dies mid-event, those bytes are dropped,
    so the client's parser sees whole JSON events, then our in-band error, never a torn line.
    """

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> bytes:
        end = chunk.rfind(b"\n\n")
        if end < 0:
            self._partial += chunk
            return b""
        ready = self._partial + chunk[: end + 2] if self._partial else chunk[: end + 2]
        self._partial = chunk[end + 2 :]
        return ready

    def flush(self) -> bytes:
        rest, self._partial = self._partial, b""
        return rest


def response_for(upstream: aiohttp.ClientResponse, request_id: str) -> web.StreamResponse:
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    response.headers.update(end_to_end(upstream.headers))
    response.headers["X-Request-Id"] = request_id
    return response


async def relay_stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    request_id: str,
    tally: StreamUsage | None = None,
) -> RelayResult:
    """Copy the engine's body to the client as it arrives.

    The loop is the hot path: one read, one framing scan for SSE, one write; no parsing. With a
    ``tally`` (adaptive admission), one ``bytes.count`` per chunk adds the token events relayed.
    """
    response = response_for(upstream, request_id)
    framer = EventFramer() if upstream.content_type == "text/event-stream" else None
    try:
        await response.prepare(request)
    except ConnectionResetError:
        return RelayResult("client_gone", response)
    while True:
        try:
            chunk = await read_chunk(upstream)
        except UpstreamError as exc:
            return await _end_broken(response, exc, sse=framer is not None)
        if not chunk:
            break
        if framer is not None and not (chunk := framer.feed(chunk)):
            continue
        if tally is not None:
            tally.relayed += chunk.count(TOKEN_MARK)
        try:
            await response.write(chunk)
        except ConnectionResetError:
            return RelayResult("client_gone", response)
    if framer is not None and (rest := framer.flush()):
        await _write_quietly(response, rest)
    await _finish(response)
    return RelayResult("completed", response)


async def _end_broken(
    response: web.StreamResponse, exc: UpstreamError, *, sse: bool
) -> RelayResult:
    if sse and not await _write_quietly(response, in_band_error(exc)):
        return RelayResult("client_gone", response, exc)
    await _finish(response)
    return RelayResult("upstream_failed", response, exc)


async def _write_quietly(response: web.StreamResponse, data: bytes) -> bool:
    """Write, reporting False instead of raising when the client has gone."""
    try:
        await response.write(data)
    except ConnectionResetError:
        return False
    return True


async def _finish(response: web.StreamResponse) -> None:
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
