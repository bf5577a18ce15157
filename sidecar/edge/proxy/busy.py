"""The busy answer: what a client gets when the bulkhead says no.

It is decided before a single response byte is sent. A streaming request from a client that
accepts ``text/event-stream`` at least as much as JSON (an ``EventSource``, a chat front end; no
``Accept`` at all, or ``*/*``) gets a 200 SSE stream with one ``event: fallback`` whose data
carries an OpenAI-shaped ``error`` (so SDKs raise with our message) and the retry hint, then
``[DONE]``. Anything else gets 429/503 with ``Retry-After`` and ``retry-after-ms``: the openai
SDKs ask for JSON even for a stream, and retry those on their own (they cannot retry a 200).
``SIDECAR_REJECT_MODE=http`` gives every client the HTTP answer.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from sidecar.core.errors import AdmissionRejectedError
from sidecar.core.outcomes import refusal_body
from sidecar.core.request.accept import wants_event_stream
from sidecar.edge.http.response import Response
from sidecar.edge.openai_errors import error_response, refusal_headers, retry_headers

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def fallback_event(exc: AdmissionRejectedError) -> bytes:
    """The SSE bytes of a fallback: one ``fallback`` event, then ``[DONE]``.

    The error object carries the same retry advice as the HTTP answer's headers (an SDK raises
    on the event; these fields are for the code that catches it): ``should_retry``, and where it
    is true ``retry_after_ms``; ``retry_after_s`` stays beside the error for older readers.
    """
    payload = refusal_body(exc.refusal, exc.message)
    should = exc.refusal.should_retry
    advice = retry_headers(exc.retry_after_s, should_retry=should)
    payload["error"]["should_retry"] = should
    data: dict[str, Any] = {**payload}
    if should:
        # The headers' own number, so that the three spellings of the hint agree to the ms.
        wait_ms = int(advice["retry-after-ms"])
        payload["error"]["retry_after_ms"] = wait_ms
        data["retry_after_s"] = wait_ms / 1000
    return f"event: fallback\ndata: {json.dumps(data)}\n\ndata: [DONE]\n\n".encode()


def busy_response(
    exc: AdmissionRejectedError,
    *,
    stream: bool,
    mode: Literal["sse", "http"],
    accept: str | None = None,
) -> Response:
    """The whole busy answer for a rejected request, by what its client acts on (``accept``: its
    ``Accept`` header); a refusal that is the request's own fault (``too_large``, a 4xx) is a
    plain HTTP error for streams too: no retry can help it."""
    sse = stream and mode == "sse" and wants_event_stream(accept)
    if not sse or not exc.refusal.should_retry:
        return error_response(exc)
    headers = {**SSE_HEADERS, **refusal_headers(exc), "X-Sidecar-Outcome": exc.refusal.code}
    return Response(
        200, fallback_event(exc), headers, content_type="text/event-stream; charset=utf-8"
    )
