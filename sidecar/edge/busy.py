"""The busy answer: what a client gets when the bulkhead says no (BRIEF §3.5).

It is decided before a single response byte is sent. A streaming request gets a 200 SSE stream
with one ``event: fallback`` whose data carries an OpenAI-shaped ``error`` (so SDKs raise with our
message) and the retry hint, then ``[DONE]``; anything else, or ``SIDECAR_REJECT_MODE=http``, gets
429/503 with ``Retry-After``.
"""

from __future__ import annotations

import json
from typing import Literal

from sidecar.core.errors import AdmissionRejectedError
from sidecar.edge.http_errors import error_response, refusal_body, retry_after_header
from sidecar.edge.response import Response

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def fallback_event(exc: AdmissionRejectedError) -> bytes:
    """The SSE bytes of a fallback: one ``fallback`` event, then ``[DONE]``."""
    payload = refusal_body(exc.refusal, exc.message)
    data = {**payload, "retry_after_s": round(exc.retry_after_s, 1)}
    return f"event: fallback\ndata: {json.dumps(data)}\n\ndata: [DONE]\n\n".encode()


def busy_response(
    exc: AdmissionRejectedError, *, stream: bool, mode: Literal["sse", "http"]
) -> Response:
    """The whole busy answer for a rejected request."""
    if not stream or mode == "http":
        return error_response(exc)
    headers = {
        **SSE_HEADERS,
        "Retry-After": retry_after_header(exc.retry_after_s),
        "X-Sidecar-Outcome": exc.refusal.code,
    }
    return Response(
        200, fallback_event(exc), headers, content_type="text/event-stream; charset=utf-8"
    )
