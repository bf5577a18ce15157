"""How a request ends: the one table of refusals and failures, the one table of how a request past
admission ended, and every request outcome label.

Each refusal (the bulkhead said no) and each upstream failure (the engine let us down) is declared
once, here, with everything that hangs off it: the HTTP status and the OpenAI error type of its
answer, its error code (also the ``outcome`` label of ``sidecar_requests`` and the
``X-Sidecar-Outcome`` header of a fallback), its message, the log event that reports it, and
whether a client retrying the same request could ever succeed (``x-should-retry``). Each way a
request past admission can end (:data:`RELAY_OUTCOMES`) is declared once with what its permit
and its outcome label say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# How a permit is given back: what the limit's control law learns from.
Outcome = Literal["completed", "cancelled", "failed"]
RejectReason = Literal["queue_full", "shed", "timeout", "too_large", "draining", "no_capacity"]
# Admission's refusals for want of room: all but a request that can never fit (too_large, the
# client's) and a shutdown (draining).
ROOM_REFUSALS: frozenset[RejectReason] = frozenset({"queue_full", "shed", "timeout", "no_capacity"})
UpstreamFailure = Literal["upstream_unavailable", "upstream_timeout"]
EdgeFault = Literal[
    "edge_busy",
    "too_many_connections",
    "too_many_client_connections",
    "too_many_partial_heads",
    "body_budget_full",
    "client_body_budget_full",
    "header_timeout",
    "body_timeout",
    "bad_request",
    "client_stalled",
]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Everything a refusal or failure maps to, in one row."""

    code: str
    status: int
    error_type: str
    message: str
    log_event: str
    should_retry: bool = True
    # The value of llm-d's DROPPED_REASON_HEADER on this refusal; None: not a flow-control drop.
    dropped_reason: str | None = None


def error_body(
    message: str, *, type_: str, code: str, param: str | None = None
) -> dict[str, dict[str, Any]]:
    """The OpenAI error object of every 4xx/5xx the sidecar itself produces, so that OpenAI SDKs
    raise their usual exception classes with our message."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def refusal_body(refusal: Refusal, message: str | None = None) -> dict[str, dict[str, Any]]:
    """The error object of a refusal or failure, as its row says (``message``: more than the
    row's own words, where there is more to say)."""
    return error_body(message or refusal.message, type_=refusal.error_type, code=refusal.code)


# llm-d's router says why it dropped a request in this response header, with these values
# (llm-d-inference-scheduler pkg/common/error/error.go, commit 520af47): the sidecar's busy
# answers use the same words, so a client behind either sees one vocabulary.
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
SATURATED = "rejected-saturated"
TTL_EXPIRED = "rejected-ttl-expired"


def _busy(code: str, status: int, message: str, dropped: str = SATURATED) -> Refusal:
    error_type = "rate_limit_error" if status == 429 else "service_unavailable"
    return Refusal(code, status, error_type, message, "admission_rejected", dropped_reason=dropped)


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
        "timeout", 429, "the request waited the maximum time for capacity; retry later",
        TTL_EXPIRED,
    ),
    # The same request can never run here: a client error, and retrying is pointless.
    "too_large": Refusal(
        "too_large", 400, "invalid_request_error",
        "the request needs more capacity than this server can ever hold at once (KV cache, or a "
        "permit per sequence: lower n, the prompt or max_tokens)",
        "admission_rejected", should_retry=False,
    ),
    "draining": _busy("draining", 503, "the server is shutting down; retry on another replica"),
    "no_capacity": _busy("no_capacity", 503, "the server has no capacity at present; retry later"),
}  # fmt: skip

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
    "too_many_client_connections": _edge(
        "too_many_client_connections", 503, "service_unavailable",
        "this client address holds its maximum number of connections; reuse one or retry shortly",
    ),
    "too_many_partial_heads": _edge(
        "too_many_partial_heads", 503, "service_unavailable",
        "too many connections are holding a request head open; send the request at once, or "
        "retry shortly",
    ),
    "body_budget_full": _edge(
        "body_budget_full", 503, "service_unavailable",
        "the request bodies being received fill this server's buffer; retry shortly",
    ),
    "client_body_budget_full": _edge(
        "client_body_budget_full", 503, "service_unavailable",
        "this client address holds its share of the request bodies being received; retry shortly",
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

# How the relay of the engine's answer to the client ended (sidecar.edge.proxy.relay).
RelayEnd = Literal["completed", "client_gone", "client_stalled", "upstream_failed", "stopped"]
# How a request past admission ended: its relay's end, the class of the engine's status where the
# answer went out whole, and the engine's failure where it broke.
Ending = Literal[
    "completed",
    "upstream_rejected",
    "upstream_error",
    "client_gone",
    "client_stalled",
    "stopped",
    "upstream_unavailable",
    "upstream_timeout",
]


@dataclass(frozen=True, slots=True)
class EndingOutcome:
    """What an ending reports: its permit's outcome, and the request's ``outcome`` label."""

    permit: Outcome
    label: str


RELAY_OUTCOMES: Mapping[Ending, EndingOutcome] = {
    # The answer went out whole: the engine's status says how it went (< 400, 4xx, 5xx).
    "completed": EndingOutcome("completed", "completed"),
    "upstream_rejected": EndingOutcome("completed", "upstream_rejected"),
    "upstream_error": EndingOutcome("failed", "upstream_error"),
    # Cut short by the client, or by the drain once its grace ran out.
    "client_gone": EndingOutcome("cancelled", "client_gone"),
    "client_stalled": EndingOutcome("cancelled", "client_stalled"),
    "stopped": EndingOutcome("cancelled", "draining"),
    # The engine failed, before its answer or during it.
    "upstream_unavailable": EndingOutcome("failed", "upstream_unavailable"),
    "upstream_timeout": EndingOutcome("failed", "upstream_timeout"),
}


def ending(end: RelayEnd, status: int, failure: UpstreamFailure | None = None) -> Ending:
    """Which row of :data:`RELAY_OUTCOMES` a relay's ``end`` is: refined by the engine's
    ``status`` where it completed, by the engine's ``failure`` where it broke."""
    if end == "upstream_failed":
        assert failure is not None, "an engine failure says which"
        return failure
    if end != "completed" or status < 400:
        return end
    return "upstream_error" if status >= 500 else "upstream_rejected"


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
