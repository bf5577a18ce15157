"""Closing the loop over real sockets: the emulated engine's numbers as the truth, zero-config,
no_capacity answered at once, and adaptive admission learning from what streams really used."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings
from tests.servers import BASE_ENV, admin_url, error_of, get_json, proxy_url, scrape, serve_app

StartPair = Callable[..., Awaitable[SidecarServer]]
# The engine prices the tiny model's token at 1,024 B; the sidecar plans from its /metrics.
ENGINE_ENV = {**BASE_ENV, "SIDECAR_CAPACITY_SOURCE": "vllm", "SIDECAR_MODEL": ""}


@pytest.fixture
async def start_pair() -> AsyncIterator[StartPair]:
    """Start an emulated engine of ``config`` and a sidecar in front of it with ``env``."""
    runners: list[web.AppRunner] = []
    servers: list[SidecarServer] = []

    async def start(config: EmulatorConfig, **env: str) -> SidecarServer:
        runner, url = await serve_app(build_app(config))
        runners.append(runner)
        server = SidecarServer(load_settings({**ENGINE_ENV, "SIDECAR_UPSTREAM_URL": url, **env}))
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()
    for runner in runners:
        await runner.cleanup()


async def test_zero_config_plans_in_the_engines_tokens(start_pair: StartPair) -> None:
    """No SIDECAR_MODEL: 16,384 engine tokens / 128-token requests x alpha 1 = 128 permits."""
    server = await start_pair(EmulatorConfig(model_name="tiny-llama"))
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert doc["served_model"] == "tiny-llama"
    assert (doc["kv_pool_tokens"], doc["kv_bytes_per_token"]) == (16_384, 1024)
    assert doc["permits"] == 128  # 128 tokens = 8 blocks of 16
    assert doc["warnings"] == []


async def test_wrong_model_is_reported_and_the_engine_wins(start_pair: StartPair) -> None:
    """Qwen2.5-7B says 57,344 B/token, the engine 1,024: warning, gauge 1, plan in 1,024."""
    server = await start_pair(EmulatorConfig(model_name="tiny-llama"), SIDECAR_MODEL="qwen2.5-7b")
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert [w["code"] for w in doc["warnings"]] == ["model_mismatch"]
    assert "57,344" in doc["warnings"][0]["message"]
    assert doc["kv_bytes_per_token"] == 1024
    assert doc["permits"] == 128
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_config_warning{code=model_mismatch}"] == 1
    assert metrics["sidecar_config_warning{code=no_capacity}"] == 0


async def test_no_capacity_refuses_at_once_and_is_not_ready(start_pair: StartPair) -> None:
    """A 1,024-token pool x 0.8 cannot hold one 1,000-token request: 503 no_capacity at once."""
    engine = EmulatorConfig(model_name="tiny-llama", kv_tokens=1024, max_model_len=1024)
    server = await start_pair(
        engine,
        SIDECAR_MAX_PROMPT_TOKENS="900",
        SIDECAR_MAX_COMPLETION_TOKENS="100",
        SIDECAR_SAFETY_FACTOR="0.8",
        SIDECAR_MAX_QUEUE="8",
        SIDECAR_MAX_WAIT_MS="60000",  # a queued request would wait a minute; this one must not
    )
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{admin_url(server)}/readyz") as ready:
            assert ready.status == 503
            reason = (await ready.json())["reason"]
        body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 10}
        async with session.post(f"{proxy_url(server)}/v1/completions", json=body) as response:
            assert response.status == 503
            assert int(response.headers["Retry-After"]) >= 1
            assert error_of(await response.read())["code"] == "no_capacity"
    assert "1,024 tokens" in reason
    assert "1,000 tokens" in reason
    assert "alpha 0.8" in reason


async def completions(server: SidecarServer, count: int, max_tokens: int) -> None:
    body = {"model": "tiny-llama", "prompt": "hi there", "max_tokens": max_tokens, "stream": True}
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            async with session.post(f"{proxy_url(server)}/v1/completions", json=body) as response:
                assert response.status == 200
                await response.read()


async def test_adaptive_learns_completion_lengths(start_pair: StartPair) -> None:
    """Completions end far before max_tokens: after 5 of them the price drops below the worst."""
    engine = EmulatorConfig(model_name="tiny-llama", completion_median_ratio=0.05, seed=3)
    server = await start_pair(
        engine,
        SIDECAR_ADMISSION="adaptive",
        SIDECAR_ADAPTIVE_MIN_SAMPLES="5",
        SIDECAR_MAX_COMPLETION_TOKENS="512",
    )
    await completions(server, 5, 512)
    terms = (await get_json(f"{admin_url(server)}/capacity"))["adaptive"]
    (learned,) = terms["expected_completion_tokens"]
    assert (learned["band"], learned["samples"]) == (512, 5)
    assert 1 <= learned["tokens"] < 512
    assert terms["fallback_reason"] is None
    metrics = await scrape(f"{admin_url(server)}/metrics")
    key = "sidecar_adaptive_expected_completion_tokens{band=512,compartment=default}"
    assert metrics[key] == learned["tokens"]
    assert metrics["sidecar_ledger_tokens"] == 0  # nothing running now
    assert metrics["sidecar_adaptive_fallback"] == 0


async def test_adaptive_falls_back_on_an_engine_that_does_not_preempt(
    start_pair: StartPair,
) -> None:
    """The emulator's OOM mode exports no preemption counter: worst-case pricing, and a warning."""
    server = await start_pair(
        EmulatorConfig(model_name="tiny-llama", oom=True, completion_median_ratio=0.05),
        SIDECAR_ADMISSION="adaptive",
        SIDECAR_ADAPTIVE_MIN_SAMPLES="1",
    )
    await completions(server, 2, 20)
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert [w["code"] for w in doc["warnings"]] == ["adaptive_unsupported"]
    assert doc["adaptive"]["overcommit_ratio"] == 1.0
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_config_warning{code=adaptive_unsupported}"] == 1
    assert metrics["sidecar_adaptive_fallback"] == 1


@pytest.mark.parametrize(
    ("engine", "pricing", "reason"),
    [
        pytest.param(
            EmulatorConfig(model_name="tiny-llama"),
            "closed-loop",
            "TTFT and TPOT",
            id="paged-engine-that-preempts",
        ),
        pytest.param(
            EmulatorConfig(model_name="tiny-llama", oom=True),
            "worst-case",
            "no preemption counter",
            id="engine-that-runs-out-instead",
        ),
    ],
)
async def test_the_default_admission_steers_where_the_engine_lets_it(
    start_pair: StartPair, engine: EmulatorConfig, pricing: str, reason: str
) -> None:
    """SIDECAR_ADMISSION unset (auto): the SLO-steered limit in front of an engine that
    preempts; held to the worst-case permits in front of one that fails on overflow."""
    server = await start_pair(engine, SIDECAR_ADMISSION="auto")
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert doc["admission"] == "slo"
    assert doc["slo"]["pricing"] == pricing
    assert reason in doc["slo"]["pricing_reason"]


def test_auto_is_the_default_admission() -> None:
    """Nothing set: the admission setting is auto."""
    assert load_settings({"SIDECAR_UPSTREAM_URL": "http://127.0.0.1:1"}).admission == "auto"


async def test_a_full_cache_holds_the_requests_in_flight_to_what_it_holds(
    start_pair: StartPair,
) -> None:
    """Eight streams of 300 + 200 tokens into a 1,024-token cache: two fill it, and it runs past
    0.8 while the sidecar holds the others. /capacity and /metrics show the drain ceiling, what
    the cache holds at that mix (no stream ended yet, so no waiter beyond it), and the
    bulkhead's limit within it."""
    engine = EmulatorConfig(
        model_name="tiny-llama", kv_tokens=1024, max_model_len=1024, tokens_per_s=50.0
    )
    server = await start_pair(
        engine,
        SIDECAR_ADMISSION="auto",
        SIDECAR_SAFETY_FACTOR="1",
        SIDECAR_REFRESH_MS="100",
        SIDECAR_MAX_PROMPT_TOKENS="300",
        SIDECAR_MAX_COMPLETION_TOKENS="200",
        SIDECAR_MAX_QUEUE="16",
        SIDECAR_MAX_WAIT_MS="60000",
    )
    body = {"model": "tiny-llama", "prompt": "hi " * 299, "max_tokens": 200, "stream": True}
    admin = admin_url(server)
    async with aiohttp.ClientSession() as session:

        async def stream() -> None:
            async with session.post(f"{proxy_url(server)}/v1/completions", json=body) as response:
                await response.read()

        tasks = [asyncio.create_task(stream()) for _ in range(8)]
        try:
            doc = await get_json(f"{admin}/capacity")
            for _ in range(100):  # ticks every 0.1 s: the cache fills within a few
                if (doc["engine_kv_usage_ratio"] or 0) >= 0.8:
                    break
                await asyncio.sleep(0.1)
                doc = await get_json(f"{admin}/capacity")
            metrics = await scrape(f"{admin}/metrics")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    slo = doc["slo"]
    assert slo["drain_limit"] is not None, doc
    reading = doc["capacity"]["engine"]
    running, kv = reading["requests_running"], reading["kv_usage_ratio"]
    assert kv >= 0.8
    assert slo["ends_per_s"] == 0.0
    assert slo["drain_limit"] == max(1, math.floor(running / kv))
    assert metrics["sidecar_slo_drain_limit"] == slo["drain_limit"]
    assert doc["limit"] <= slo["drain_limit"]
