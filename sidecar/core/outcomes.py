"""How a request ends: the one table of refusals and failures, and every request outcome label.

Each refusal (the bulkhead said no) and each upstream failure (the engine let us down) is declared
once, here, with everything that hangs off it: the HTTP status and the OpenAI error type of its
answer, its error code (also the ``outcome`` label of ``sidecar_requests`` and the
``X-Sidecar-Outcome`` header of a fallback), its message, and the log event that reports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

RejectReason = Literal["queue_full", "shed", "timeout", "too_large", "draining", "no_capacity"]
UpstreamFailure = Literal["upstream_unavailable", "upstream_timeout"]
EdgeFault = Literal[
    "edge_busy", "too_many_connections", "header_timeout", "body_timeout", "bad_request",
    "client_stalled",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Refusal:
    """Everything a refusal or failure maps to, in one row."""

    code: str
    status: int
    error_type: str
    message: str
    log_event: str


def _busy(code: str, status: int, message: str) -> Refusal:
    error_type = "rate_limit_error" if status == 429 else "service_unavailable"
    return Refusal(code, status, error_type, message, "admission_rejected")


def _upstream(code: str, status: int, message: str) -> Refusal:
    return Refusal(code, status, "upstream_error", message, "upstream_failed")


REJECTIONS: Mapping[RejectReason, Refusal] = {
    "queue_full": _busy(
        "queue_full", 429, "the server is at capacity and its queue is full; retry later"
    ),
    "shed": _busy(
        "shed", 429, "the server is at capacity and does not queue this priority class; retry later"
    ),
    "timeout": _busy(
        "timeout", 429, "the request waited the maximum time for capacity; retry later"
    ),
    "too_large": _busy(
        "too_large", 429, "the request needs more KV cache than this server can ever hold at once"
    ),
    "draining": _busy("draining", 503, "the server is shutting down; retry on another replica"),
    "no_capacity": _busy("no_capacity", 503, "the server has no capacity at present; retry later"),
}

UPSTREAM_FAILURES: Mapping[UpstreamFailure, Refusal] = {
    "upstream_unavailable": _upstream(
        "upstream_unavailable", 502, "the inference engine is unreachable"
    ),
    "upstream_timeout": _upstream(
        "upstream_timeout", 504, "the inference engine did not answer in time"
    ),
}


def _edge(code: str, status: int, error_type: str, message: str) -> Refusal:
    return Refusal(code, status, error_type, message, code)


# What the bounded edge refuses or ends before (or instead of) admission.
EDGE_FAULTS: Mapping[EdgeFault, Refusal] = {
    "edge_busy": _edge(
        "edge_busy", 503, "service_unavailable",
        "too many requests are being read and checked at once; retry shortly",
    ),
    "too_many_connections": _edge(
        "too_many_connections", 503, "service_unavailable",
        "the server holds its maximum number of client connections; retry shortly",
    ),
    "header_timeout": _edge(
        "header_timeout", 408, "invalid_request_error", "the request headers took too long"
    ),
    "body_timeout": _edge(
        "body_timeout", 408, "invalid_request_error", "the request body took too long to arrive"
    ),
    "bad_request": _edge(
        "bad_request", 400, "invalid_request_error", "the request is not valid HTTP/1.1"
    ),
    "client_stalled": _edge(
        "client_stalled", 408, "invalid_request_error",
        "the client stopped reading the response; the stream was ended",
    ),
}  # fmt: skip

# Every value of sidecar_requests{outcome=...}: how a completion request ended.
REQUEST_OUTCOMES: tuple[str, ...] = (
    "completed",
    "client_gone",
    "invalid",
    "upstream_rejected",
    "upstream_error",
    *UPSTREAM_FAILURES,
    *REJECTIONS,
    *EDGE_FAULTS,
    "error",
)
