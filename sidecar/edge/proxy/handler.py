"""The proxy port: one handler routes on the normalised path; everything that may generate passes
admission, priced by its token budget where it has one; free paths pass straight through."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import structlog
from multidict import CIMultiDict

from sidecar.core.claims import NO_CLAIMS, Claims
from sidecar.core.errors import (
    AdmissionRejectedError,
    EdgeRefusedError,
    RequestError,
    UpstreamError,
)
from sidecar.core.ledger import StreamUsage
from sidecar.core.outcomes import EdgeFault
from sidecar.core.request_checks import CheckedRequest, TokenPolicy
from sidecar.core.request_id import accepted_request_id
from sidecar.core.stream_timing import StreamTiming
from sidecar.edge.engine.client import read_all, release, send
from sidecar.edge.engine.http1 import end_to_end
from sidecar.edge.engine.pool import EnginePool, EngineResponse
from sidecar.edge.http.errors import error_response
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer, Response
from sidecar.edge.http.server import Handler
from sidecar.edge.proxy.busy import busy_response
from sidecar.edge.proxy.in_flight import InFlight, Stop
from sidecar.edge.proxy.intake import BodyLimits, Gate, checked_request, read_body, require_json
from sidecar.edge.proxy.prompt_count import EnginePromptCounter
from sidecar.edge.proxy.relay import RelayResult, relay_stream
from sidecar.edge.proxy.routes import DEFAULT_FREE_PATHS, Target, route
from sidecar.limiter.bulkhead import Bulkhead
from sidecar.limiter.permit import Permit
from sidecar.telemetry.log_context import bind_request, unbind_request
from sidecar.telemetry.metrics import RequestMetrics

log = structlog.get_logger(__name__)
# On an answer whose max_tokens the sidecar lowered to its budget (SIDECAR_OVER_BUDGET=clamp):
# the value the engine was given, so a client can tell a short answer from a clamped one.
CLAMPED_HEADER = "X-Sidecar-Max-Tokens-Clamped"
random_bits = random.getrandbits  # seeded from os.urandom at start, and again after a fork


@dataclass(frozen=True)
class ProxyConfig:
    """What the proxy handlers need, built once from the settings."""

    budget: Callable[[], TokenPolicy]  # the budget in force (it follows the engine's limits)
    reject_mode: Literal["sse", "http"]
    # A checked request's cost in the admission mode's unit, and its live footprint (adaptive).
    price: Callable[[CheckedRequest, str], tuple[int, StreamUsage | None]]
    compartment_of: Callable[[Claims, str | None], str]  # claims, tenant
    tenant_of: Callable[[Mapping[str, str], Claims], str | None]
    # What a request claims in its headers, as far as its peer (an IP address) is trusted to.
    claims_of: Callable[[Mapping[str, str], str | None], Claims] = lambda _h, _p: NO_CLAIMS
    flat_price: Callable[[], int] = lambda: 1
    free_paths: frozenset[str] = frozenset(DEFAULT_FREE_PATHS)
    body: BodyLimits = field(default_factory=BodyLimits)
    write_timeout_s: float = 30.0
    sheddable: Callable[[Claims], bool] = lambda _claims: False
    # Adaptive admission: what a completed request teaches.
    learn: Callable[[StreamUsage], None] = lambda _u: None
    # The longest a request may wait for a permit (None: the bulkhead's own wait).
    max_wait_of: Callable[[Claims], float | None] = lambda claims: claims.max_wait_s
    # A stream about to be relayed: its timing, stamped as tokens come, and its claims.
    track: Callable[[StreamTiming, Claims], None] = lambda _t, _c: None
    # A tracked stream ended: its timing, when it arrived, and how it ended.
    timed: Callable[[StreamTiming, float, str], None] = lambda _t, _a, _o: None
    # Logs an edge refusal (a budget full, a body too slow) once per burst, not once a request.
    log_refusal: Callable[[EdgeFault], None] = lambda _fault: None


@dataclass(frozen=True)
class Proxy:
    config: ProxyConfig
    bulkhead: Bulkhead
    upstream: EnginePool
    metrics: RequestMetrics
    clock: Callable[[], float] = time.monotonic
    counter: EnginePromptCounter | None = None
    gate: Gate = field(default_factory=lambda: Gate(32))
    in_flight: InFlight = field(default_factory=InFlight)


class Job(NamedTuple):
    """A request read and priced, ready for admission."""

    target: Target
    body: bytes | None
    cost: int  # what a request without a token budget costs; a checked one is priced at admission
    stream: bool  # streaming completion: busy answers are SSE
    whole: bool  # a non-streaming completion: read the engine's answer whole
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    checked: CheckedRequest | None = None  # a completion's checks, for adaptive pricing
    headers: CIMultiDict[str] | None = None  # what goes to the engine, where already built


def proxy_handler(proxy: Proxy) -> Handler:
    """Every request on the proxy port goes to :func:`handle` (routing is ours, on the
    normalised path)."""
    return functools.partial(handle, proxy)


async def handle(proxy: Proxy, request: Request) -> Answer:
    """Route, read, check (inside the gate), admit, forward, relay."""
    # The client's own id where it is a bounded token; else 32 hex digits like uuid4().hex,
    # without its getrandom syscall: an id must be unique, not unpredictable.
    given = accepted_request_id(request.headers.get("X-Request-Id"))
    request_id = given or f"{random_bits(128):032x}"
    claims = proxy.config.claims_of(request.headers, request.peer)
    tenant = proxy.config.tenant_of(request.headers, claims)
    bound = bind_request(request_id, tenant)
    try:
        started = proxy.clock()
        try:
            target = route(request.method, request.raw_path, proxy.config.free_paths)
            if target.kind == "free":
                return await passthrough(request, proxy, target, request_id)
            job = await _intake(request, proxy, target, request_id)
        except (RequestError, EdgeRefusedError) as exc:
            return _refused(proxy, exc, started)
        return await _admit_and_forward(
            request, proxy, job, request_id, Admission(claims, tenant), started=started
        )
    finally:
        unbind_request(bound)


def _refused(proxy: Proxy, exc: RequestError | EdgeRefusedError, started: float) -> Response:
    outcome = exc.fault if isinstance(exc, EdgeRefusedError) else "invalid"
    proxy.metrics.finished(outcome, proxy.clock() - started)
    if isinstance(exc, EdgeRefusedError):
        proxy.config.log_refusal(exc.fault)
    else:
        log.info("request_invalid", code=exc.code, status=exc.status)
    return error_response(exc)


async def _intake(request: Request, proxy: Proxy, target: Target, request_id: str) -> Job:
    """Everything before admission: the body (outside the gate: a client that is slow to send it
    holds only its own connection), then the checks and the engine's prompt count (inside it)."""
    config = proxy.config
    if target.endpoint is None:
        body = await read_body(request, config.body) if request.body_exists else None
        return Job(target, body, config.flat_price(), stream=False, whole=False)
    require_json(request)
    body = await read_body(request, config.body)
    # Built here only where the engine counts the prompt; else once, in _forward.
    headers = _upstream_headers(request, request_id) if proxy.counter is not None else None
    with proxy.gate:
        checked = await checked_request(
            body, target.endpoint, config.budget(), counter=proxy.counter, headers=headers or {}
        )
    return Job(
        target, checked.body, 0, checked.stream, not checked.stream,
        checked.prompt_tokens, checked.completion_tokens, checked, headers,
    )  # fmt: skip


class Admission(NamedTuple):
    """Who a request is, as admission sees it: what it may claim, and its tenant."""

    claims: Claims
    tenant: str | None


async def _admit_and_forward(
    request: Request, proxy: Proxy, job: Job, request_id: str, who: Admission, *, started: float
) -> Answer:
    config = proxy.config
    compartment = config.compartment_of(who.claims, who.tenant)
    if job.checked is not None:
        cost, usage = config.price(job.checked, compartment)
    else:
        cost, usage = job.cost, None
    outcome, queue_wait = "error", 0.0
    try:
        may_wait = not config.sheddable(who.claims)
        admit = proxy.bulkhead.admit(
            cost, compartment, usage, may_wait=may_wait, max_wait_s=config.max_wait_of(who.claims)
        )
        async with admit as permit:
            queue_wait = permit.wait_s
            timing = StreamTiming(proxy.clock()) if job.stream else None
            if timing is not None:
                config.track(timing, who.claims)
            try:
                with proxy.in_flight.track() as stop:
                    forwarded = _forward(
                        request, proxy, job, permit, request_id, stop=stop, timing=timing
                    )
                    response, outcome = await forwarded
            finally:
                if timing is not None:
                    config.timed(timing, started, outcome)
            if outcome == "completed" and permit.usage is not None:
                config.learn(permit.usage)
            return response
    except AdmissionRejectedError as exc:
        outcome, queue_wait = exc.reason, exc.waited_s
        log.info(
            exc.refusal.log_event,
            reason=exc.reason,
            queue_wait_s=round(queue_wait, 4),
            retry_after_s=round(exc.retry_after_s, 2),
            cost=cost,
            compartment=compartment,
            stream=job.stream,
        )
        return busy_response(exc, stream=job.stream, mode=proxy.config.reject_mode)
    except asyncio.CancelledError:
        outcome = "client_gone"
        raise
    finally:
        duration = proxy.clock() - started
        proxy.metrics.finished(outcome, duration)
        log.info(
            "request_finished", outcome=outcome, duration_s=round(duration, 4),
            queue_wait_s=round(queue_wait, 4), path=job.target.path,
            prompt_tokens_est=job.prompt_tokens, max_tokens=job.completion_tokens,
        )  # fmt: skip


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


async def _forward(
    request: Request, proxy: Proxy, job: Job, permit: Permit, request_id: str, *, stop: Stop,
    timing: StreamTiming | None = None,
) -> tuple[Answer, str]:  # fmt: skip
    headers = job.headers if job.headers is not None else _upstream_headers(request, request_id)
    granted = _GrantLine(permit, job)
    try:
        try:
            if timing is not None:
                timing.sent = proxy.clock()
            target = job.target.path_qs
            upstream = await send(
                proxy.upstream, request.method, target, headers, job.body, sent=granted.went_out
            )
        finally:
            granted()  # where the request never went out, its grant is still logged, first
    except UpstreamError as exc:
        # Written: the engine had it and its answer did not come; else it never reached it.
        return _upstream_failed(permit, exc, "answer" if granted.sent else "connect")
    except asyncio.CancelledError:
        if not stop.claim():
            raise
        return _stopped_response(permit)
    if job.checked is not None and job.checked.clamped is not None:
        upstream.forwarded = (*upstream.forwarded, (CLAMPED_HEADER, str(job.checked.clamped)))
    try:
        if job.whole:
            return await _relay_whole(upstream, permit, request_id, stop)
        result = await relay_stream(
            request, upstream, request_id,
            write_timeout_s=proxy.config.write_timeout_s, stop=stop, tally=permit.usage,
            timing=timing, clock=proxy.clock,
        )  # fmt: skip
        return result_response(result, permit)
    finally:
        release(upstream)


def _upstream_failed(permit: Permit, exc: UpstreamError, phase: str) -> tuple[Answer, str]:
    """The engine failed before an answer started: the permit ends failed, the client gets a 5xx."""
    permit.outcome = "failed"
    log.warning(exc.refusal.log_event, error=str(exc), phase=phase)
    return error_response(exc), exc.refusal.code


def _stopped_response(permit: Permit) -> tuple[Answer, str]:
    permit.outcome = "cancelled"
    return error_response(AdmissionRejectedError("draining", 1.0)), "draining"


def result_response(result: RelayResult, permit: Permit) -> tuple[Answer, str]:
    """Turn a finished relay into the outcome the permit and the metrics report."""
    if result.end in ("client_gone", "client_stalled", "stopped"):
        permit.outcome = "cancelled"
        if result.end == "client_stalled":
            log.warning("client_stalled", phase="stream")
        return result.response, "draining" if result.end == "stopped" else result.end
    if result.error is not None:
        permit.outcome = "failed"
        log.warning(result.error.refusal.log_event, error=str(result.error), phase="stream")
        return result.response, result.error.refusal.code
    if result.response.status >= 500:
        permit.outcome = "failed"
        return result.response, "upstream_error"
    return result.response, "completed" if result.response.status < 400 else "upstream_rejected"


async def _relay_whole(
    upstream: EngineResponse, permit: Permit, request_id: str, stop: Stop
) -> tuple[Answer, str]:
    try:
        body = await read_all(upstream)
    except UpstreamError as exc:
        return _upstream_failed(permit, exc, "body")
    except asyncio.CancelledError:
        if not stop.claim():
            raise
        return _stopped_response(permit)
    response = Response(upstream.status, body, upstream.forwarded)
    response.headers["X-Request-Id"] = request_id
    if upstream.status >= 500:
        permit.outcome = "failed"
        return response, "upstream_error"
    completion = _log_usage(body)
    if permit.usage is not None and completion is not None:
        permit.usage.relayed = completion
    return response, "completed" if upstream.status < 400 else "upstream_rejected"


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


async def passthrough(request: Request, proxy: Proxy, target: Target, request_id: str) -> Answer:
    """A free path (GET, HEAD, OPTIONS, or a configured cheap POST): forwarded without a permit."""
    try:
        body = await read_body(request, proxy.config.body) if request.body_exists else None
        upstream = await send(
            proxy.upstream,
            request.method,
            target.path_qs,
            _upstream_headers(request, request_id),
            body,
        )
    except EdgeRefusedError as exc:  # a free path's body too slow, or no room for it: counted
        proxy.metrics.refused(exc.fault)
        proxy.config.log_refusal(exc.fault)
        return error_response(exc)
    except (RequestError, UpstreamError) as exc:
        return error_response(exc)
    try:
        result = await relay_stream(
            request, upstream, request_id, write_timeout_s=proxy.config.write_timeout_s
        )
    finally:
        release(upstream)
    return result.response


def _upstream_headers(request: Request, request_id: str) -> CIMultiDict[str]:
    # Built once per request; the engine client writes the fields as they are, in this order.
    headers = end_to_end(request.headers)
    headers["X-Request-Id"] = request_id
    return headers
