"""The proxy port: completions go through admission, every other path passes straight through."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import structlog
from aiohttp import web

from sidecar.core.errors import AdmissionRejectedError, RequestError, UpstreamError
from sidecar.core.ledger import StreamUsage
from sidecar.core.request_checks import (
    CheckedRequest,
    Endpoint,
    TokenPolicy,
    check_request,
    enforce_prompt_budget,
    with_prompt_tokens,
)
from sidecar.edge.busy import busy_response
from sidecar.edge.engine_client import Upstream, end_to_end, finish, read_all
from sidecar.edge.http_errors import error_response
from sidecar.edge.prompt_count import EnginePromptCounter
from sidecar.edge.relay import RelayResult, relay_stream
from sidecar.limiter.bulkhead import Bulkhead, Permit
from sidecar.telemetry.metrics import RequestMetrics

log = structlog.get_logger("sidecar.edge.proxy")

ENDPOINTS: Mapping[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
}


@dataclass(frozen=True)
class ProxyConfig:
    """What the proxy handlers need, built once from the settings."""

    budget: TokenPolicy
    reject_mode: Literal["sse", "http"]
    max_body_bytes: int
    price: Callable[[CheckedRequest], int]
    compartment_of: Callable[[Mapping[str, str]], str]
    tenant_of: Callable[[Mapping[str, str]], str | None]
    sheddable: Callable[[Mapping[str, str]], bool] = lambda _headers: False
    # Adaptive admission: a request's live footprint, and what a completed one teaches.
    usage_of: Callable[[CheckedRequest, str], StreamUsage | None] = lambda _r, _c: None
    learn: Callable[[StreamUsage], None] = lambda _u: None


@dataclass(frozen=True)
class Proxy:
    config: ProxyConfig
    bulkhead: Bulkhead
    upstream: Upstream
    metrics: RequestMetrics
    clock: Callable[[], float] = time.monotonic
    counter: EnginePromptCounter | None = None


PROXY = web.AppKey("proxy", Proxy)


def build_proxy_app(proxy: Proxy) -> web.Application:
    app = web.Application(client_max_size=proxy.config.max_body_bytes)
    app[PROXY] = proxy
    for path in ENDPOINTS:
        app.router.add_post(path, completions)
    app.router.add_route("*", "/{tail:.*}", passthrough)
    return app


async def completions(request: web.Request) -> web.StreamResponse:
    """Check, admit (or turn away), forward and relay one completion request."""
    proxy = request.app[PROXY]
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    tenant = proxy.config.tenant_of(request.headers)
    with structlog.contextvars.bound_contextvars(request_id=request_id, tenant=tenant):
        started = proxy.clock()
        try:
            checked = await _checked(request, proxy, request_id)
        except RequestError as exc:
            proxy.metrics.finished("invalid", proxy.clock() - started)
            log.info("request_invalid", code=exc.code, param=exc.param, status=exc.status)
            return error_response(exc)
        return await _admit_and_forward(request, proxy, checked, request_id, started)


async def _checked(request: web.Request, proxy: Proxy, request_id: str) -> CheckedRequest:
    """The request, validated and budgeted; its prompt counted by the engine where configured."""
    budget = proxy.config.budget
    checked = check_request(await _read_body(request), ENDPOINTS[request.path], budget)
    if checked.tokenize is None or proxy.counter is None:
        return checked
    tokens = await proxy.counter.count(checked.tokenize, _upstream_headers(request, request_id))
    if tokens is None:  # the engine could not say: the estimate prices it, and bounds it
        enforce_prompt_budget(checked.prompt_tokens, checked.prompt_param, budget)
        return checked
    return with_prompt_tokens(checked, tokens, budget)


async def _admit_and_forward(
    request: web.Request, proxy: Proxy, checked: CheckedRequest, request_id: str, started: float
) -> web.StreamResponse:
    compartment = proxy.config.compartment_of(request.headers)
    usage = proxy.config.usage_of(checked, compartment)
    cost = usage.charge() if usage is not None else proxy.config.price(checked)
    outcome, queue_wait = "error", 0.0
    try:
        may_wait = not proxy.config.sheddable(request.headers)
        async with proxy.bulkhead.admit(cost, compartment, usage, may_wait=may_wait) as permit:
            queue_wait = permit.wait_s
            _log_grant(permit, checked)
            response, outcome = await _forward(request, proxy, checked, permit, request_id)
            if outcome == "completed" and permit.usage is not None:
                proxy.config.learn(permit.usage)
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
            stream=checked.stream,
        )
        return busy_response(exc, stream=checked.stream, mode=proxy.config.reject_mode)
    except asyncio.CancelledError:
        outcome = "client_gone"
        raise
    finally:
        duration = proxy.clock() - started
        proxy.metrics.finished(outcome, duration)
        log.info(
            "request_finished",
            outcome=outcome,
            duration_s=round(duration, 4),
            queue_wait_s=round(queue_wait, 4),
            prompt_tokens_est=checked.prompt_tokens,
            max_tokens=checked.completion_tokens,
        )


def _log_grant(permit: Permit, checked: CheckedRequest) -> None:
    log.info(
        "admission_granted",
        queue_wait_s=round(permit.wait_s, 4),
        cost=permit.cost,
        compartment=permit.compartment,
        stream=checked.stream,
        shadow_would_reject=permit.shadow_rejected,
    )


async def _forward(
    request: web.Request, proxy: Proxy, checked: CheckedRequest, permit: Permit, request_id: str
) -> tuple[web.StreamResponse, str]:
    headers = _upstream_headers(request, request_id)
    try:
        upstream = await proxy.upstream.send("POST", request.path_qs, headers, checked.body)
    except UpstreamError as exc:
        permit.outcome = "failed"
        log.warning(exc.refusal.log_event, error=str(exc), phase="connect")
        return error_response(exc), _upstream_outcome(exc)
    try:
        if checked.stream:
            result = await relay_stream(request, upstream, request_id, permit.usage)
            return result_response(result, permit)
        return await _relay_whole(upstream, permit, request_id)
    finally:
        finish(upstream)


def result_response(result: RelayResult, permit: Permit) -> tuple[web.StreamResponse, str]:
    """Turn a finished relay into the outcome the permit and the metrics report."""
    if result.end == "client_gone":
        permit.outcome = "cancelled"
        return result.response, "client_gone"
    if result.error is not None:
        permit.outcome = "failed"
        log.warning(result.error.refusal.log_event, error=str(result.error), phase="stream")
        return result.response, _upstream_outcome(result.error)
    if result.response.status >= 500:
        permit.outcome = "failed"
        return result.response, "upstream_error"
    return result.response, "completed" if result.response.status < 400 else "upstream_rejected"


async def _relay_whole(
    upstream: aiohttp.ClientResponse, permit: Permit, request_id: str
) -> tuple[web.StreamResponse, str]:
    try:
        body = await read_all(upstream)
    except UpstreamError as exc:
        permit.outcome = "failed"
        log.warning(exc.refusal.log_event, error=str(exc), phase="body")
        return error_response(exc), _upstream_outcome(exc)
    response = web.Response(status=upstream.status, body=body, headers=end_to_end(upstream.headers))
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
    except (ValueError, AttributeError):
        return None
    if not isinstance(usage, dict):
        return None
    counts = {k: v for k, v in usage.items() if isinstance(v, int)}
    log.info("usage", **counts)
    return counts.get("completion_tokens")


def _upstream_outcome(exc: UpstreamError) -> str:
    return exc.refusal.code


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any other path: forwarded as it is, without a permit."""
    proxy = request.app[PROXY]
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    try:
        body = await _read_body(request) if request.body_exists else None
        upstream = await proxy.upstream.send(
            request.method, request.path_qs, _upstream_headers(request, request_id), body
        )
    except (RequestError, UpstreamError) as exc:
        return error_response(exc)
    try:
        result = await relay_stream(request, upstream, request_id)
    finally:
        finish(upstream)
    return result.response


async def _read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise RequestError(
            f"request body is larger than this server's limit of {request.client_max_size} bytes",
            status=413,
            code="body_too_large",
        ) from exc
    except (asyncio.IncompleteReadError, aiohttp.ClientPayloadError) as exc:
        raise RequestError("request body ended early", code="incomplete_body") from exc


def _upstream_headers(request: web.Request, request_id: str) -> dict[str, str]:
    headers = dict(end_to_end(request.headers))
    headers["X-Request-Id"] = request_id
    return headers
