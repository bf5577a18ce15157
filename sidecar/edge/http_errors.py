"""The one place where errors become HTTP answers, in the OpenAI error shape.

Every 4xx/5xx the sidecar itself produces has the body
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}`` so that OpenAI SDKs raise
their usual exception classes with our message.
"""

from __future__ import annotations

import json
import math
from typing import Any

from aiohttp import web

from sidecar.core.errors import (
    AdmissionRejectedError,
    RequestError,
    SidecarError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)

# Rejection reason -> HTTP status when the busy answer is plain HTTP (BRIEF §3.5).
REJECTION_STATUS = {
    "queue_full": 429,
    "timeout": 429,
    "too_large": 429,
    "draining": 503,
    "no_capacity": 503,
}


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
) -> web.Response:
    body = json.dumps(error_body(message, type_=type_, code=code, param=param))
    return web.Response(
        status=status, text=body, content_type="application/json", headers=headers or {}
    )


def rejection_type(reason: str) -> str:
    return "rate_limit_error" if REJECTION_STATUS.get(reason, 503) == 429 else "service_unavailable"


def error_response(exc: SidecarError) -> web.Response:
    """Map a sidecar error to its HTTP answer; unknown errors are a 500, never a traceback."""
    if isinstance(exc, RequestError):
        return json_error(
            exc.status, exc.message, type_="invalid_request_error", code=exc.code, param=exc.param
        )
    if isinstance(exc, AdmissionRejectedError):
        return json_error(
            REJECTION_STATUS.get(exc.reason, 503),
            exc.message,
            type_=rejection_type(exc.reason),
            code=exc.reason,
            headers={"Retry-After": retry_after_header(exc.retry_after_s)},
        )
    if isinstance(exc, UpstreamTimeoutError):
        return json_error(504, str(exc), type_="upstream_error", code="upstream_timeout")
    if isinstance(exc, UpstreamUnavailableError):
        return json_error(502, str(exc), type_="upstream_error", code="upstream_unavailable")
    return json_error(500, "internal sidecar error", type_="server_error", code="internal_error")
