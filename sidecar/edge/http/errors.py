"""The one place where errors become HTTP answers, in the OpenAI error shape.

Every 4xx/5xx the sidecar itself produces has the body
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`` so that OpenAI SDKs raise
their usual exception classes with our message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from sidecar.core.errors import (
    AdmissionRejectedError,
    EdgeRefusedError,
    RequestError,
    SidecarError,
    UpstreamError,
)
from sidecar.core.outcomes import DROPPED_REASON_HEADER, Refusal, error_body, refusal_body
from sidecar.core.retry_hint import clamped_retry_s
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer, Response, StreamResponse
from sidecar.edge.message import UnsendableHeadError


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
            exc.status, exc.message, type_="invalid_request_error", code=exc.code, param=exc.param,
            headers=retry_headers(0.0, should_retry=False),
        )  # fmt: skip
    if isinstance(exc, AdmissionRejectedError):
        return _refusal_response(exc.refusal, exc.message, refusal_headers(exc))
    if isinstance(exc, UpstreamError):
        return _refusal_response(exc.refusal, str(exc), {})
    if isinstance(exc, EdgeRefusedError):
        retry = retry_headers(1.0, should_retry=True) if exc.refusal.status == 503 else {}
        return _refusal_response(exc.refusal, exc.refusal.message, retry)
    return json_error(500, "internal sidecar error", type_="server_error", code="internal_error")


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


def rest_of_answer(
    request: Request, response: Answer | None, keeps: Callable[[Request], bool]
) -> tuple[bytes, bool | None]:
    """What is left to write of ``request``'s answer once its handler returned (``None``: it
    failed), and whether the connection is kept (None: the answer must be cut off). An answer
    that cannot be sent, or none at all, is a 500 in its place, where nothing of it went out."""
    if isinstance(response, StreamResponse) and response.prepared:
        return b"", response.finished and not response.closes and keeps(request)
    if isinstance(response, Response):
        keep = keeps(request)
        try:
            return response.encode(request, close=not keep), keep
        except UnsendableHeadError:
            return INTERNAL_ERROR.encode(request, close=True), False
    if request.started:
        return b"", None
    return INTERNAL_ERROR.encode(request, close=True), False


# A handler that failed, or an answer that cannot be sent: the same 500 as any unknown error.
INTERNAL_ERROR = error_response(SidecarError())
