"""The admin port over real sockets: /capacity, /metrics, /healthz, /readyz, and what they count."""

from __future__ import annotations

import io
import json

import aiohttp
import openai
import pytest
import structlog

from sidecar.entry.logs import configure_logging
from tests.servers import (
    OpenAIFactory,
    StartSidecar,
    admin_url,
    error_of,
    get_json,
    proxy_url,
    refused_port,
    scrape,
    sidecars,
)

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}


async def test_capacity_shows_the_plan_with_provenance(start_sidecar: StartSidecar) -> None:
    """/capacity reports permits, use, the KV figures and where every term came from."""
    server = await start_sidecar()
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert doc["permits"] == 2
    assert (doc["in_use"], doc["queued"], doc["utilisation"]) == (0, 0, 0)
    assert doc["kv_bytes_per_token"] == 1024
    assert doc["kv_pool_bytes"] == 262_144
    assert doc["request_max_bytes"] == 128 * 1024
    assert (doc["source"], doc["stale"]) == ("static", False)
    terms = doc["capacity"]["plan"]["terms"]
    assert terms, "every term of the formula is listed"
    assert all(term["source"] in {"declared", "measured", "engine", "derived"} for term in terms)


async def test_metrics_expose_the_required_series(start_sidecar: StartSidecar) -> None:
    """/metrics parses with the Prometheus parser and carries the series autoscalers read."""
    server = await start_sidecar()
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_permits_limit"] == 2
    assert metrics["sidecar_permits_in_use"] == 0
    assert metrics["sidecar_permit_utilisation"] == 0
    assert metrics["sidecar_queue_depth"] == 0
    assert metrics["sidecar_kv_pool_bytes"] == 262_144
    assert metrics["sidecar_capacity_stale"] == 0
    assert "sidecar_queue_wait_seconds_count" in metrics
    assert metrics["sidecar_requests_total{outcome=completed}"] == 0


async def test_requests_are_counted_by_outcome(
    start_sidecar: StartSidecar, openai_client: OpenAIFactory
) -> None:
    """A completed request and an invalid one are each counted under their outcome."""
    server = await start_sidecar()
    await openai_client(proxy_url(server)).completions.create(
        model="tiny-llama", prompt="hi", max_tokens=2
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy_url(server)}/v1/completions", data=b"{oops") as response,
    ):
        assert response.status == 400
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_requests_total{outcome=completed}"] == 1
    assert metrics["sidecar_requests_total{outcome=invalid}"] == 1
    assert metrics["sidecar_request_duration_seconds_count"] == 2


async def test_bad_input_never_reaches_the_engine(start_sidecar: StartSidecar, engine: str) -> None:
    """Invalid bodies are answered at the sidecar: 400/413, OpenAI-shaped, engine untouched."""
    server = await start_sidecar(SIDECAR_MAX_BODY_BYTES="2KiB")
    cases = [
        (b"{not json", 400, "invalid_json"),
        (b'{"model": "m", "prompt": "x", "max_tokens": 29}', 400, "max_tokens_over_budget"),
        (b'{"model": "m", "prompt": "x", "max_tokens": -1}', 400, "invalid_value"),
        (b'{"model": "m", "prompt": "x", "stream": "yes"}', 400, "invalid_type"),
        (b'{"model": "m", "prompt": "' + b"x" * 4096 + b'"}', 413, "body_too_large"),
    ]
    async with aiohttp.ClientSession() as session:
        for body, status, code in cases:
            async with session.post(
                f"{proxy_url(server)}/v1/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as response:
                assert response.status == status, body[:40]
                assert error_of(await response.read())["code"] == code, body[:60]
    engine_metrics = await scrape(f"{engine}/metrics")
    assert engine_metrics["vllm:prompt_tokens_total{engine=0,model_name=tiny-llama}"] == 0


async def test_readiness_fails_while_draining(start_sidecar: StartSidecar) -> None:
    """Draining fails /readyz at once and turns new requests away with 503."""
    server = await start_sidecar()
    assert (await get_json(f"{admin_url(server)}/readyz"))["ready"] is True
    assert await server.drain(grace_s=1.0)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{admin_url(server)}/readyz") as response:
            assert response.status == 503
        async with session.post(f"{proxy_url(server)}/v1/chat/completions", json=CHAT) as response:
            assert response.status == 503
            assert error_of(await response.read())["code"] == "draining"
            assert int(response.headers["Retry-After"]) >= 1


async def test_healthz_is_ok_while_the_loop_runs(start_sidecar: StartSidecar) -> None:
    """/healthz answers 200 while the capacity loop is alive."""
    server = await start_sidecar()
    assert (await get_json(f"{admin_url(server)}/healthz"))["status"] == "ok"


async def test_logs_carry_decisions_but_never_the_api_key(
    start_sidecar: StartSidecar, openai_client: OpenAIFactory
) -> None:
    """One event per decision and per finished request, with request id and hashed tenant."""
    server = await start_sidecar()
    written = io.StringIO()
    configure_logging("info", stream=written)
    try:
        await openai_client(proxy_url(server)).completions.create(
            model="tiny-llama", prompt="hi", max_tokens=2
        )
    finally:
        structlog.reset_defaults()
    events = [json.loads(line) for line in written.getvalue().splitlines()]
    names = [event["event"] for event in events]
    assert [n for n in names if n in ("admission_granted", "request_finished")] == [
        "admission_granted",
        "request_finished",
    ]
    finished = next(event for event in events if event["event"] == "request_finished")
    assert finished["outcome"] == "completed"
    assert finished["request_id"]
    assert finished["tenant"].startswith("key-")
    assert "sk-test-secret" not in written.getvalue()


async def test_the_admin_port_answers_only_its_endpoints(start_sidecar: StartSidecar) -> None:
    """An unknown admin path is a JSON 404, a POST a 405 naming GET and HEAD, a HEAD of /healthz
    a 200 with no body; nothing of it reaches the proxy's counters."""
    server = await start_sidecar()
    base = admin_url(server)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/v1/chat/completions") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "not_found"
        async with session.post(f"{base}/capacity", json={}) as response:
            assert response.status == 405
            assert response.headers["Allow"] == "GET, HEAD"
            assert (await response.json())["error"]["code"] == "method_not_allowed"
        async with session.head(f"{base}/healthz") as response:
            assert response.status == 200
            assert await response.read() == b""
        async with session.get(f"{base}/metrics?name[]=x") as response:
            assert response.status == 200
            assert response.content_type == "text/plain"
    metrics = await scrape(f"{base}/metrics")
    assert metrics["sidecar_requests_total{outcome=completed}"] == 0


async def test_a_grant_is_logged_first_where_the_engine_cannot_be_reached(
    openai_client: OpenAIFactory,
) -> None:
    """The grant's line is written once the engine has the request (while it works); where the
    request never got there, the line still comes once, before the failure it led to."""
    with refused_port() as port:
        written = await _log_of_one_refused_request(openai_client, port)
    names = [json.loads(line)["event"] for line in written.splitlines()]
    assert names == ["admission_granted", "upstream_failed", "request_finished"]


async def _log_of_one_refused_request(openai_client: OpenAIFactory, port: int) -> str:
    """The sidecar's log lines while one request goes to ``port``, which answers 502."""
    written = io.StringIO()
    async with sidecars(f"http://127.0.0.1:{port}") as start:
        server = await start()
        configure_logging("info", stream=written)
        try:
            client = openai_client(proxy_url(server))
            with pytest.raises(openai.APIStatusError) as failed:
                await client.completions.create(model="tiny-llama", prompt="hi", max_tokens=2)
        finally:
            structlog.reset_defaults()
    assert failed.value.status_code == 502
    return written.getvalue()
