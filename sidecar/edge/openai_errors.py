"""Where the sidecar's errors become the proxy's and the admin app's HTTP answers, in the OpenAI
error shape. The HTTP server side's own answers have it too: its refusals at the door
(:func:`sidecar.edge.message.raw_answer`) and the 500 of a handler that failed
(:func:`sidecar.edge.http.response.internal_error`, also this module's answer to an unknown error).

Every 4xx/5xx the sidecar itself produces has the body
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`` so that OpenAI SDKs raise
their usual exception classes with our message.
"""

from __future__ import annotations

import json
import math

from sidecar.core.admission.retry_hint import clamped_retry_s
from sidecar.core.errors import (
    AdmissionRejectedError,
    EdgeRefusedError,
    RequestError,
    SidecarError,
    UpstreamError,
)
from sidecar.core.outcomes import DROPPED_REASON_HEADER, Refusal, error_body, refusal_body
from sidecar.edge.http.response import Response, internal_error


def retry_after_header(retry_after_s: float) -> str:
    """``Retry-After`` takes whole seconds; round up so a client never comes back too early."""
    return str(max(1, math.ceil(clamped_retry_s(retry_after_s))))


def retry_headers(retry_after_s: float, *, should_retry: bool) -> dict[str, str]:
    """What tells a client (and the openai SDK, which reads them) whether and when to retry.

    ``retry-after-ms`` (read first by the SDK) and ``Retry-After`` come from the same estimate;
    ``x-should-retry: false`` where the same request can never succeed, and then no delay at all.
    """
    if not should_retry:
        return {"x-should-retry": "false"}
    wait_ms = max(1, math.ceil(clamped_retry_s(retry_after_s) * 1000))
    return {
        "Retry-After": retry_after_header(retry_after_s),
        "retry-after-ms": str(wait_ms),
        "x-should-retry": "true",
    }


def json_error(
    status: int,
    message: str,
    *,
    type_: str,
    code: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = json.dumps(error_body(message, type_=type_, code=code, param=param)).encode()
    return Response(status, body, headers, content_type="application/json")


def error_response(exc: SidecarError) -> Response:
    """Map a sidecar error to its HTTP answer; unknown errors are a 500, never a traceback."""
    if isinstance(exc, RequestError):
        return json_error(
            exc.status,
            exc.message,
            type_="invalid_request_error",
            code=exc.code,
            param=exc.param,
            headers=retry_headers(0.0, should_retry=False),
        )
    if isinstance(exc, AdmissionRejectedError):
        return _refusal_response(exc.refusal, exc.message, refusal_headers(exc))
    if isinstance(exc, UpstreamError):
        return _refusal_response(exc.refusal, str(exc), {})
    if isinstance(exc, EdgeRefusedError):
        retry = (
            retry_headers(exc.retry_after_s, should_retry=True) if exc.refusal.status == 503 else {}
        )
        return _refusal_response(exc.refusal, exc.refusal.message, retry)
    return internal_error()


def refusal_headers(exc: AdmissionRejectedError) -> dict[str, str]:
    """The retry advice and llm-d's dropped-reason header of an admission refusal."""
    refusal = exc.refusal
    headers = retry_headers(exc.retry_after_s, should_retry=refusal.should_retry)
    if refusal.dropped_reason is not None:
        headers[DROPPED_REASON_HEADER] = refusal.dropped_reason
    return headers


def _refusal_response(refusal: Refusal, message: str, headers: dict[str, str]) -> Response:
    body = json.dumps(refusal_body(refusal, message)).encode()
    return Response(refusal.status, body, headers, content_type="application/json")
