"""The outcome table: every refusal and upstream failure, walked through a real socket."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sidecar.core.errors import (
    AdmissionRejectedError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from sidecar.core.outcomes import (
    REJECTIONS,
    RELAY_OUTCOMES,
    REQUEST_OUTCOMES,
    UPSTREAM_FAILURES,
    Outcome,
    Refusal,
    RejectReason,
    RelayEnd,
    UpstreamFailure,
    ending,
)
from sidecar.edge.http.limits import EdgeLimits
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer
from sidecar.edge.http.server import HttpServer
from sidecar.edge.openai_errors import error_response
from sidecar.edge.proxy.busy import busy_response
from sidecar.edge.proxy.relay import in_band_error
from sidecar.entry.listen import bind
from sidecar.telemetry.metrics import RequestMetrics

UPSTREAM_CLASSES: dict[UpstreamFailure, type[UpstreamError]] = {
    "upstream_unavailable": UpstreamUnavailableError,
    "upstream_timeout": UpstreamTimeoutError,
}
# What each row must say, written out by hand so a wrong table entry fails here.
EXPECTED = {
    "queue_full": (429, "rate_limit_error", "admission_rejected"),
    "shed": (429, "rate_limit_error", "admission_rejected"),
    "timeout": (429, "rate_limit_error", "admission_rejected"),
    "too_large": (400, "invalid_request_error", "admission_rejected"),
    "draining": (503, "service_unavailable", "admission_rejected"),
    "no_capacity": (503, "service_unavailable", "admission_rejected"),
    "upstream_unavailable": (502, "upstream_error", "upstream_failed"),
    "upstream_timeout": (504, "upstream_error", "upstream_failed"),
}

Handler = Callable[[Request], Answer]
Fetch = Callable[[Handler], Awaitable[tuple[int, dict[str, str], bytes]]]


@pytest.fixture
async def answer() -> AsyncIterator[Fetch]:
    """Serve one handler on the proxy port's own server, on a real loopback socket, and fetch its
    answer."""
    servers: list[HttpServer] = []

    async def fetch(handler: Handler) -> tuple[int, dict[str, str], bytes]:
        async def route(request: Request) -> Answer:
            return handler(request)

        sock = bind("127.0.0.1", 0)
        server = HttpServer(route, EdgeLimits(), max_body_bytes=1024)
        await server.start(sock)
        servers.append(server)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
        async with aiohttp.ClientSession() as session, session.post(url) as response:
            return response.status, dict(response.headers), await response.read()

    yield fetch
    for server in servers:
        await server.close(0.5)


def test_every_row_is_declared_as_expected() -> None:
    """Each row's status, error type and log event is the one written out by hand."""
    table: dict[str, Refusal] = dict(REJECTIONS.items()) | dict(UPSTREAM_FAILURES.items())
    assert {code: (r.status, r.error_type, r.log_event) for code, r in table.items()} == EXPECTED
    assert all(code == row.code for code, row in table.items())


# What each refusal tells a client about retrying, by hand: (x-should-retry, llm-d's reason).
ADVICE = {
    "queue_full": ("true", "rejected-saturated"),
    "shed": ("true", "rejected-saturated"),
    "timeout": ("true", "rejected-ttl-expired"),
    "too_large": ("false", None),
    "draining": ("true", "rejected-saturated"),
    "no_capacity": ("true", "rejected-saturated"),
}
RETRYABLE = [reason for reason, (should, _) in ADVICE.items() if should == "true"]


@pytest.mark.parametrize("reason", list(REJECTIONS), ids=str)
async def test_rejection_advice_headers(answer: Fetch, reason: RejectReason) -> None:
    """Each refusal says whether to retry, and when, in the headers the openai SDK reads."""
    exc = AdmissionRejectedError(reason, 2.2)
    _status, headers, _body = await answer(lambda _r: busy_response(exc, stream=False, mode="sse"))
    should, dropped = ADVICE[reason]
    assert headers["x-should-retry"] == should
    assert headers.get("x-llm-d-request-dropped-reason") == dropped
    delays = (headers.get("Retry-After"), headers.get("retry-after-ms"))
    assert delays == (("3", "2200") if should == "true" else (None, None))


@pytest.mark.parametrize(
    ("estimate_s", "seconds", "millis"),
    [
        pytest.param(0.0004, "1", "1", id="under-a-millisecond"),
        pytest.param(0.5, "1", "500", id="half-a-second"),
        pytest.param(59.9991, "60", "60000", id="just-under-the-cap"),
        pytest.param(61.0, "60", "60000", id="over-the-cap"),
        pytest.param(3600.0, "60", "60000", id="an-hour"),
    ],
)
async def test_retry_delays_agree_and_stay_within_the_sdk_limit(
    answer: Fetch, estimate_s: float, seconds: str, millis: str
) -> None:
    """Both delays come from one estimate, rounded up, never 0, never past 60 s."""
    exc = AdmissionRejectedError("queue_full", estimate_s)
    _status, headers, _body = await answer(lambda _r: busy_response(exc, stream=False, mode="sse"))
    assert (headers["Retry-After"], headers["retry-after-ms"]) == (seconds, millis)


@pytest.mark.parametrize("reason", RETRYABLE, ids=str)
async def test_rejection_as_plain_http(answer: Fetch, reason: RejectReason) -> None:
    """A rejection answers with its row's status, OpenAI body and a Retry-After."""
    exc = AdmissionRejectedError(reason, 2.2)
    status, headers, body = await answer(lambda _r: busy_response(exc, stream=False, mode="sse"))
    row = REJECTIONS[reason]
    assert status == EXPECTED[reason][0]
    assert json.loads(body)["error"] == {
        "message": row.message,
        "type": row.error_type,
        "param": None,
        "code": reason,
    }
    assert headers["Retry-After"] == "3"


async def test_a_request_too_large_to_ever_run_is_a_plain_400_for_streams_too(
    answer: Fetch,
) -> None:
    """Retrying cannot help a too_large request: no fallback stream, no delay, x-should-retry
    false."""
    exc = AdmissionRejectedError("too_large", 60.0)
    status, headers, body = await answer(lambda _r: busy_response(exc, stream=True, mode="sse"))
    assert (status, headers["x-should-retry"], "Retry-After" in headers) == (400, "false", False)
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("reason", RETRYABLE, ids=str)
async def test_rejection_as_sse_fallback(answer: Fetch, reason: RejectReason) -> None:
    """A streaming rejection is a 200 fallback event carrying the same error object and advice."""
    exc = AdmissionRejectedError(reason, 0.6)
    status, headers, body = await answer(lambda _r: busy_response(exc, stream=True, mode="sse"))
    fallback, done, rest = body.decode().split("\n\n")
    event, data = fallback.split("\n")
    payload = json.loads(data.removeprefix("data: "))
    assert (status, headers["X-Sidecar-Outcome"], event) == (200, reason, "event: fallback")
    assert (payload["error"]["code"], payload["error"]["type"]) == (reason, EXPECTED[reason][1])
    assert payload["retry_after_s"] == 0.6
    assert (payload["error"]["should_retry"], payload["error"]["retry_after_ms"]) == (True, 600)
    assert (headers["retry-after-ms"], headers["x-should-retry"]) == ("600", "true")
    assert (done, rest) == ("data: [DONE]", "")


@pytest.mark.parametrize("failure", list(UPSTREAM_FAILURES), ids=str)
async def test_upstream_failure_as_http(answer: Fetch, failure: UpstreamFailure) -> None:
    """An upstream failure before the answer started maps to its row's status and code."""
    exc = UPSTREAM_CLASSES[failure]("detail")
    status, _headers, body = await answer(lambda _r: error_response(exc))
    error = json.loads(body)["error"]
    assert (status, error["type"], error["code"]) == (*EXPECTED[failure][:2], failure)
    assert error["message"] == UPSTREAM_FAILURES[failure].message + ": detail"


@pytest.mark.parametrize("failure", list(UPSTREAM_FAILURES), ids=str)
def test_upstream_failure_in_band(failure: UpstreamFailure) -> None:
    """A failure mid-stream ends the SSE stream with the same row's error object, then [DONE]."""
    data, done = in_band_error(UPSTREAM_CLASSES[failure]()).decode().split("\n\n")[:2]
    error = json.loads(data.removeprefix("data: "))["error"]
    assert (error["type"], error["code"], done) == (EXPECTED[failure][1], failure, "data: [DONE]")


def test_every_outcome_is_a_metric_label_from_the_start() -> None:
    """sidecar_requests exports every outcome (0 until it happens), the table's codes included."""
    registry = CollectorRegistry()
    RequestMetrics(registry)
    text = generate_latest(registry).decode()
    for code in (*REJECTIONS, *UPSTREAM_FAILURES, *REQUEST_OUTCOMES):
        assert f'sidecar_requests_total{{outcome="{code}"}} 0.0' in text


@pytest.mark.parametrize(
    ("end", "status", "failure", "permit", "label"),
    [
        pytest.param("completed", 200, None, "completed", "completed", id="relayed-200"),
        pytest.param("completed", 304, None, "completed", "completed", id="relayed-304"),
        pytest.param("completed", 400, None, "completed", "upstream_rejected", id="relayed-400"),
        pytest.param("completed", 503, None, "failed", "upstream_error", id="relayed-503"),
        pytest.param("client_gone", 200, None, "cancelled", "client_gone", id="client-gone"),
        pytest.param("client_gone", 500, None, "cancelled", "client_gone", id="gone-from-a-500"),
        pytest.param(
            "client_stalled", 200, None, "cancelled", "client_stalled", id="client-stalled"
        ),
        pytest.param("stopped", 200, None, "cancelled", "draining", id="drain-stopped-it"),
        pytest.param(
            "upstream_failed", 200, "upstream_timeout", "failed", "upstream_timeout",
            id="engine-timed-out-mid-stream",
        ),
        pytest.param(
            "upstream_failed", 200, "upstream_unavailable", "failed", "upstream_unavailable",
            id="engine-reset-mid-stream",
        ),
    ],
)  # fmt: skip
def test_how_a_relay_ended_is_one_row(
    end: RelayEnd, status: int, failure: UpstreamFailure | None, permit: Outcome, label: str
) -> None:
    """Each way a request past admission ends gives back its permit and counts as its own row."""
    row = RELAY_OUTCOMES[ending(end, status, failure)]
    assert (row.permit, row.label) == (permit, label)
    assert row.label in REQUEST_OUTCOMES
