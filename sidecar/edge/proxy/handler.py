"""The proxy port: one handler routes on the normalised path; everything that may generate passes
admission, priced by its token budget where it has one; free paths pass straight through."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import structlog

from sidecar.core.admission.returns import Returns, fingerprint
from sidecar.core.errors import (
    AdmissionRejectedError,
    EdgeRefusedError,
    RequestError,
    UpstreamError,
)
from sidecar.core.outcomes import ROOM_REFUSALS
from sidecar.core.request.claims import Claims
from sidecar.core.request.request_id import accepted_request_id
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.edge.engine.client import release, send
from sidecar.edge.engine.pool import EnginePool
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer, Response
from sidecar.edge.http.server import Handler
from sidecar.edge.openai_errors import error_response
from sidecar.edge.proxy.busy import busy_response
from sidecar.edge.proxy.forward import forward, upstream_headers
from sidecar.edge.proxy.in_flight import InFlight
from sidecar.edge.proxy.intake import (
    BodyLimits,
    Gate,
    Job,
    checked_request,
    read_body,
    require_json,
)
from sidecar.edge.proxy.policy import ProxyPolicy
from sidecar.edge.proxy.prompt_count import EnginePromptCounter
from sidecar.edge.proxy.relay import ClientStall, relay_stream
from sidecar.edge.proxy.routes import ProxyPaths, Target, route
from sidecar.limiter.bulkhead import Bulkhead
from sidecar.limiter.permit import Permit
from sidecar.telemetry.log_context import bind_request, unbind_request
from sidecar.telemetry.metrics import RequestMetrics

log = structlog.get_logger(__name__)
random_bits = random.getrandbits  # seeded from os.urandom at start, and again after a fork


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    """The proxy's plain settings, read once."""

    reject_mode: Literal["sse", "http"]
    paths: ProxyPaths = field(default_factory=ProxyPaths)
    body: BodyLimits = field(default_factory=BodyLimits)
    write_timeout_s: float = 30.0
    stall_s: float = 2.0  # a write's wait on its client while a request waits for a permit


@dataclass(frozen=True, kw_only=True)
class Proxy:
    config: ProxyConfig
    policy: ProxyPolicy  # admission, pricing and limits: who a request is, its price, its wait
    bulkhead: Bulkhead
    upstream: EnginePool
    metrics: RequestMetrics
    clock: Callable[[], float] = time.monotonic
    counter: EnginePromptCounter | None = None
    gate: Gate = field(default_factory=lambda: Gate(32))
    in_flight: InFlight = field(default_factory=InFlight)
    returns: Returns = field(default_factory=Returns)  # refused callers, known again when back


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
    claims = proxy.policy.claims_of(request.headers, request.client or None)
    tenant = proxy.policy.tenant_of(request.headers, claims)
    bound = bind_request(request_id, tenant)
    try:
        started = proxy.clock()
        try:
            target = route(request.method, request.raw_path, proxy.config.paths)
            if target.kind == "free":
                return await passthrough(request, proxy, target, request_id)
            job = await _intake(request, proxy, target, request_id)
        except (RequestError, EdgeRefusedError) as exc:
            return _refused(proxy, exc, started)
        return await _admit_and_forward(
            request,
            proxy,
            job,
            request_id,
            Caller(claims, tenant, source_of(tenant, request.client)),
            started=started,
        )
    finally:
        unbind_request(bound)


def _refused(proxy: Proxy, exc: RequestError | EdgeRefusedError, started: float) -> Response:
    outcome = exc.fault if isinstance(exc, EdgeRefusedError) else "invalid"
    proxy.metrics.finished(outcome, proxy.clock() - started)
    if isinstance(exc, EdgeRefusedError):
        proxy.policy.log_refusal(exc.fault)
    else:
        log.info("request_invalid", code=exc.code, status=exc.status)
    return error_response(exc)


async def _intake(request: Request, proxy: Proxy, target: Target, request_id: str) -> Job:
    """Everything before admission: the body (outside the gate: a client that is slow to send it
    holds only its own connection), then the checks and the engine's prompt count (inside it)."""
    config, policy = proxy.config, proxy.policy
    if target.endpoint is None:
        body = await read_body(request, config.body) if request.body_exists else None
        return Job(
            target=target,
            body=body,
            flat_cost=policy.flat_price(),
            stream=False,
            whole_answer=False,
        )
    require_json(request)
    body = await read_body(request, config.body)
    # Built here only where the engine counts the prompt; else once, in forward.
    headers = upstream_headers(request, request_id) if proxy.counter is not None else None
    with proxy.gate:
        checked = await checked_request(
            body,
            target.endpoint,
            policy.budget(),
            counter=proxy.counter,
            headers=headers or {},
            client=request.client,
        )
    return Job(
        target=target,
        body=checked.body,
        flat_cost=0,
        stream=checked.stream,
        whole_answer=not checked.stream,
        prompt_tokens=checked.prompt_tokens,
        completion_tokens=checked.completion_tokens,
        checked=checked,
        headers=headers,
    )


class Caller(NamedTuple):
    """Who a request is, as admission sees it: what it may claim, its tenant, and its source
    (:func:`source_of`)."""

    claims: Claims
    tenant: str | None
    source: str | None


def source_of(tenant: str | None, client: str) -> str | None:
    """Who sent a request, for the bulkhead's grant order by source (the waiter whose source
    holds fewest places first): its tenant, a better name than an address, else its client's
    address. Behind a gateway every anonymous request shares the gateway's address: one
    source, served first come, first served as before."""
    return tenant or client or None


async def _admit_and_forward(
    request: Request, proxy: Proxy, job: Job, request_id: str, who: Caller, *, started: float
) -> Answer:
    """Price the job, admit it (or answer busy) and forward it; counted and logged once as it
    finished, whatever ended it."""
    policy = proxy.policy
    compartment = policy.compartment_of(who.claims, who.tenant)
    if job.checked is not None:
        cost, usage = policy.price(job.checked, compartment)
    else:
        cost, usage = job.flat_cost, None
    outcome, queue_wait = "error", 0.0
    pending = proxy.returns.pending(started)
    key = fingerprint(who.tenant, job.target.path, job.body) if pending else None
    returning = key is not None and proxy.returns.back(key, started)
    try:
        may_wait = not policy.sheddable(who.claims)
        # A caller back as told has spent its TTFT objective: its own TTL alone bounds the
        # bulkhead's wait for returns.
        max_wait_s = who.claims.ttl_s if returning else policy.max_wait_of(who.claims)
        admit = proxy.bulkhead.admit(
            cost,
            compartment,
            usage,
            may_wait=may_wait,
            max_wait_s=max_wait_s,
            returning=returning,
            source=who.source,
        )
        async with admit as permit:
            queue_wait = permit.wait_s
            if returning:
                proxy.metrics.returned("admitted")
            response, outcome = await _forward_admitted(
                request, proxy, job, request_id, permit, claims=who.claims, started=started
            )
            return response
    except AdmissionRejectedError as exc:
        outcome, queue_wait = exc.reason, exc.waited_s
        if exc.reason in ROOM_REFUSALS:
            key = key or fingerprint(who.tenant, job.target.path, job.body)
            proxy.returns.told(key, proxy.clock() + exc.retry_after_s, started)
        if returning:
            proxy.metrics.returned("refused")
        log.info(
            exc.refusal.log_event,
            reason=exc.reason,
            returning=returning,
            queue_wait_s=round(queue_wait, 4),
            retry_after_s=round(exc.retry_after_s, 2),
            cost=cost,
            compartment=compartment,
            stream=job.stream,
        )
        return busy_response(
            exc,
            stream=job.stream,
            mode=proxy.config.reject_mode,
            accept=",".join(request.headers.getall("Accept", ())) or None,
        )
    except asyncio.CancelledError:
        outcome = "client_gone"
        raise
    finally:
        _finished(proxy, job, outcome, proxy.clock() - started, queue_wait)


async def _forward_admitted(
    request: Request,
    proxy: Proxy,
    job: Job,
    request_id: str,
    permit: Permit,
    *,
    claims: Claims,
    started: float,
) -> tuple[Answer, str]:
    """Forward a request that holds its permit: a stream's timing tracked, what a completed
    request used learned from."""
    policy = proxy.policy
    timing = StreamTiming(sent=proxy.clock(), on_first=permit.first_token) if job.stream else None
    if timing is not None:
        policy.track(timing, started, claims)
    outcome = "error"
    try:
        with proxy.in_flight.track() as stop:
            response, outcome = await forward(
                request,
                job,
                permit,
                request_id,
                engine=proxy.upstream,
                stop=stop,
                write_timeout_s=proxy.config.write_timeout_s,
                clock=proxy.clock,
                timing=timing,
                stall=ClientStall(proxy.bulkhead.waiting, proxy.config.stall_s),
            )
    finally:
        if timing is not None:
            policy.timed(timing, started, outcome)
    if outcome == "completed" and permit.usage is not None:
        policy.learn(permit.usage)
    return response, outcome


def _finished(proxy: Proxy, job: Job, outcome: str, duration: float, queue_wait: float) -> None:
    """A request past its checks ended: counted, and its one finished line."""
    proxy.metrics.finished(outcome, duration)
    log.info(
        "request_finished",
        outcome=outcome,
        duration_s=round(duration, 4),
        queue_wait_s=round(queue_wait, 4),
        path=job.target.path,
        prompt_tokens_est=job.prompt_tokens,
        max_tokens=job.completion_tokens,
    )


async def passthrough(request: Request, proxy: Proxy, target: Target, request_id: str) -> Answer:
    """A free path (GET, HEAD, OPTIONS, or a configured cheap POST): forwarded without a permit."""
    try:
        body = await read_body(request, proxy.config.body) if request.body_exists else None
        upstream = await send(
            proxy.upstream,
            request.method,
            target.path_qs,
            upstream_headers(request, request_id),
            body,
        )
    except EdgeRefusedError as exc:  # a free path's body too slow, or no room for it: counted
        proxy.metrics.refused(exc.fault)
        proxy.policy.log_refusal(exc.fault)
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
