"""Past admission: the request sent to the engine and its answer relayed back, whole or as a
stream; how that ended is one row of :data:`sidecar.core.outcomes.RELAY_OUTCOMES`, which says
the permit's outcome and the request's outcome label."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import structlog
from multidict import CIMultiDict

from sidecar.core.errors import AdmissionRejectedError, UpstreamError
from sidecar.core.outcomes import RELAY_OUTCOMES, Ending, ending
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.edge.engine.client import read_all, release, send
from sidecar.edge.engine.http1 import end_to_end
from sidecar.edge.engine.pool import EnginePool, EngineResponse
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer, Response
from sidecar.edge.openai_errors import error_response
from sidecar.edge.proxy.in_flight import Stop
from sidecar.edge.proxy.intake import Job
from sidecar.edge.proxy.relay import ClientStall, RelayResult, relay_stream
from sidecar.limiter.permit import Permit

log = structlog.get_logger(__name__)
# On an answer whose max_tokens the sidecar lowered to its budget (SIDECAR_OVER_BUDGET=clamp):
# the value the engine was given, so a client can tell a short answer from a clamped one.
CLAMPED_HEADER = "X-Sidecar-Max-Tokens-Clamped"


async def forward(
    request: Request,
    job: Job,
    permit: Permit,
    request_id: str,
    *,
    engine: EnginePool,
    stop: Stop,
    write_timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    timing: StreamTiming | None = None,
    stall: ClientStall | None = None,
) -> tuple[Answer, str]:
    """Send ``job`` to the engine and relay its answer; the answer and the request's outcome
    label, the permit's outcome set from the same row. Where the drain stops it before the
    answer started, a 503 ``draining`` (a stream already started ends in-band instead)."""
    try:
        return await _send_and_relay(
            request,
            job,
            permit,
            request_id,
            engine=engine,
            stop=stop,
            write_timeout_s=write_timeout_s,
            clock=clock,
            timing=timing,
            stall=stall,
        )
    except asyncio.CancelledError:
        if not stop.claim():
            raise
        return _ended(permit, error_response(AdmissionRejectedError("draining", 1.0)), "stopped")


async def _send_and_relay(
    request: Request,
    job: Job,
    permit: Permit,
    request_id: str,
    *,
    engine: EnginePool,
    stop: Stop,
    write_timeout_s: float,
    clock: Callable[[], float],
    timing: StreamTiming | None,
    stall: ClientStall | None,
) -> tuple[Answer, str]:
    headers = job.headers if job.headers is not None else upstream_headers(request, request_id)
    granted = _GrantLine(permit, job)
    try:
        try:
            if timing is not None:
                timing.sent = clock()
            upstream = await send(
                engine,
                request.method,
                job.target.path_qs,
                headers,
                job.body,
                sent=granted.went_out,
            )
        finally:
            granted()  # where the request never went out, its grant is still logged, first
    except UpstreamError as exc:
        # Written: the engine had it and its answer did not come; else it never reached it.
        return _ended(permit, *_engine_failed(exc, "answer" if granted.sent else "connect"))
    if job.checked is not None and job.checked.clamped is not None:
        upstream.forwarded = (*upstream.forwarded, (CLAMPED_HEADER, str(job.checked.clamped)))
    try:
        if job.whole_answer:
            return _ended(permit, *await _relay_whole(upstream, permit, request_id))
        result = await relay_stream(
            request,
            upstream,
            request_id,
            write_timeout_s=write_timeout_s,
            stop=stop,
            tally=permit.usage,
            timing=timing,
            clock=clock,
            stall=stall,
        )
        return _ended(permit, result.response, _stream_ending(result))
    finally:
        release(upstream)


def _ended(permit: Permit, answer: Answer, end: Ending) -> tuple[Answer, str]:
    """The answer, with what its row of the table says: the permit's outcome, and the label."""
    outcome = RELAY_OUTCOMES[end]
    permit.outcome = outcome.permit
    return answer, outcome.label


def _engine_failed(exc: UpstreamError, phase: str) -> tuple[Response, Ending]:
    """The engine failed before an answer started: a 5xx for the client, logged."""
    log.warning(exc.refusal.log_event, error=str(exc), phase=phase)
    return error_response(exc), exc.failure


def _stream_ending(result: RelayResult) -> Ending:
    """Which row a streamed relay's end is, what the operator must hear of logged."""
    error = result.error
    if result.end == "client_stalled":
        log.warning("client_stalled", phase="stream")
    elif result.end == "upstream_failed" and error is not None:
        log.warning(error.refusal.log_event, error=str(error), phase="stream")
    return ending(result.end, result.response.status, error.failure if error else None)


async def _relay_whole(
    upstream: EngineResponse, permit: Permit, request_id: str
) -> tuple[Response, Ending]:
    """The engine's answer read whole, then sent in one write; its usage logged and counted."""
    try:
        body = await read_all(upstream)
    except UpstreamError as exc:
        return _engine_failed(exc, "body")
    response = Response(upstream.status, body, upstream.forwarded)
    response.headers["X-Request-Id"] = request_id
    if upstream.status < 500:
        completion = _log_usage(body)
        if permit.usage is not None and completion is not None:
            permit.usage.relayed = completion
    return response, ending("completed", upstream.status)


def _log_usage(body: bytes) -> int | None:
    """Log the engine's usage object; returns its completion_tokens where it gives them."""
    try:
        usage: Any = json.loads(body).get("usage")
    except (ValueError, AttributeError, RecursionError):
        return None
    if not isinstance(usage, dict):
        return None
    counts = {k: v for k, v in usage.items() if isinstance(v, int)}
    log.info("usage", **counts)
    return counts.get("completion_tokens")


def upstream_headers(request: Request, request_id: str) -> CIMultiDict[str]:
    """What goes to the engine: the client's end-to-end fields and the request's id. Built once
    per request; the engine client writes the fields as they are, in this order."""
    headers = end_to_end(request.headers)
    headers["X-Request-Id"] = request_id
    return headers


class _GrantLine:
    """The grant's log line, written once: as soon as the engine has the request, so that writing
    it runs while the engine works, not before it is asked; or, where the request never went
    out, before what ends it is logged."""

    __slots__ = ("_job", "_permit", "sent")

    def __init__(self, permit: Permit, job: Job) -> None:
        self._permit: Permit | None = permit
        self._job = job
        self.sent = False

    def went_out(self) -> None:
        """The engine client wrote the request: log the grant now."""
        self.sent = True
        self()

    def __call__(self) -> None:
        permit, self._permit = self._permit, None
        if permit is not None:
            log.info(
                "admission_granted",
                queue_wait_s=round(permit.wait_s, 4),
                cost=permit.cost,
                compartment=permit.compartment,
                stream=self._job.stream,
                shadow_would_reject=permit.shadow_rejected,
            )
