"""The one place where errors become HTTP answers, in the OpenAI error shape.

Every 4xx/5xx the sidecar itself produces has the body
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`` so that OpenAI SDKs raise
their usual exception classes with our message.
"""

from __future__ import annotations

import json
import math
from typing import Any

from sidecar.core.errors import (
    AdmissionRejectedError,
    EdgeRefusedError,
    RequestError,
    SidecarError,
    UpstreamError,
)
from sidecar.core.outcomes import Refusal
from sidecar.edge.response import Response


def error_body(
    message: str, *, type_: str, code: str, param: str | None = None
) -> dict[str, dict[str, Any]]:
    """The OpenAI-shaped error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def retry_after_header(retry_after_s: float) -> str:
    """``Retry-After`` takes whole seconds; round up so a client never comes back too early."""
    return str(max(1, math.ceil(retry_after_s)))


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


def refusal_body(refusal: Refusal, message: str) -> dict[str, dict[str, Any]]:
    """The error object of a refusal or upstream failure, as its outcome-table row says."""
    return error_body(message, type_=refusal.error_type, code=refusal.code)


def error_response(exc: SidecarError) -> Response:
    """Map a sidecar error to its HTTP answer; unknown errors are a 500, never a traceback."""
    if isinstance(exc, RequestError):
        return json_error(
            exc.status, exc.message, type_="invalid_request_error", code=exc.code, param=exc.param
        )
    if isinstance(exc, AdmissionRejectedError):
        return _refusal_response(
            exc.refusal, exc.message, {"Retry-After": retry_after_header(exc.retry_after_s)}
        )
    if isinstance(exc, UpstreamError):
        return _refusal_response(exc.refusal, str(exc), {})
    if isinstance(exc, EdgeRefusedError):
        retry = {"Retry-After": "1"} if exc.refusal.status == 503 else {}
        return _refusal_response(exc.refusal, exc.refusal.message, retry)
    return json_error(500, "internal sidecar error", type_="server_error", code="internal_error")


def _refusal_response(refusal: Refusal, message: str, headers: dict[str, str]) -> Response:
    body = json.dumps(refusal_body(refusal, message)).encode()
    return Response(refusal.status, body, headers, content_type="application/json")
