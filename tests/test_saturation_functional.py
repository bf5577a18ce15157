"""The scale-out signal on a live sidecar: 0 idle, the streams' pace against the objective while
they run, 2 once every request lately was refused; /capacity and /metrics say the same, with the
limit's unit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from emulator.app import build_app
from emulator.config import EmulatorConfig
from tests.servers import StartSidecar, admin_url, get_json, proxy_url, scrape, serve_app, until

BODY = {"model": "tiny-llama", "prompt": "hold", "max_tokens": 28}


@pytest.fixture
async def slow_engine() -> AsyncIterator[str]:
    """An emulated engine at 5 tokens/s a stream: a 28-token stream runs for seconds."""
    config = EmulatorConfig(model_name="tiny-llama", tokens_per_s=5)
    runner, url = await serve_app(build_app(config))
    yield url
    await runner.cleanup()


@pytest.fixture
async def fast_engine() -> AsyncIterator[str]:
    """An emulated engine at 25 tokens/s a stream: 40 ms a token."""
    config = EmulatorConfig(model_name="tiny-llama", tokens_per_s=25)
    runner, url = await serve_app(build_app(config))
    yield url
    await runner.cleanup()


async def test_idle_sidecar_reads_zero_and_names_its_unit(start_sidecar: StartSidecar) -> None:
    """Idle: utilisation 0 in /capacity and /metrics; count admission's limit is in sequences."""
    server = await start_sidecar()
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert doc["utilisation"] == 0
    assert doc["saturation"] == {
        "utilisation": 0,
        "ttft": 0,
        "tpot": 0,
        "kv": 0,
        "slots": 0,
        "refusals": 0,
    }
    assert (doc["limit"], doc["limit_unit"], doc["worst_case_permits"]) == (2, "sequences", 2)
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_utilisation"] == 0
    assert metrics["sidecar_admission_limit{unit=sequences}"] == 2
    assert metrics["sidecar_admission_in_use{unit=sequences}"] == 0


async def test_streams_slower_than_the_objective_read_past_one(
    start_sidecar: StartSidecar, fast_engine: str
) -> None:
    """An engine at 25 tokens/s (40 ms a token) against a 20 ms TPOT objective: once short
    streams complete while a long one runs, the tpot term reads their pace over the objective
    (about 2, no floor yet); when the long one ends, the pod is idle and reads 0."""
    server = await start_sidecar(SIDECAR_UPSTREAM_URL=fast_engine, SIDECAR_SLO_TPOT_MS="20")
    admin = admin_url(server)
    async with aiohttp.ClientSession() as session:
        long = asyncio.create_task(_stream(session, proxy_url(server), max_tokens=28))
        for _ in range(3):
            await _stream(session, proxy_url(server), max_tokens=4)
        doc = await get_json(f"{admin}/capacity")
        assert doc["in_use"] >= 1  # the long stream is still running
        assert 1.5 < doc["saturation"]["tpot"] < 3.0
        assert doc["utilisation"] == doc["saturation"]["tpot"]
        metrics = await scrape(f"{admin}/metrics")
        assert metrics["sidecar_utilisation_term{term=tpot}"] == pytest.approx(
            doc["saturation"]["tpot"], abs=1e-3
        )
        await long
    assert (await get_json(f"{admin}/capacity"))["utilisation"] == 0


async def test_a_refusal_pushes_the_signal_to_two(
    start_sidecar: StartSidecar, slow_engine: str
) -> None:
    """Two streams hold both permits, a third waits: once it has waited past its 200 ms TTFT
    objective the ttft term reads past 1. A fourth is refused (queue full), the only request
    that ended lately: the refusal term reads 1 + 1/1."""
    server = await start_sidecar(
        SIDECAR_UPSTREAM_URL=slow_engine,
        SIDECAR_MAX_QUEUE="1",
        SIDECAR_MAX_WAIT_MS="60000",
        SIDECAR_SLO_TTFT_MS="200",
    )
    admin = admin_url(server)
    assert (await get_json(f"{admin}/capacity"))["utilisation"] == 0  # the refusal window's base
    async with aiohttp.ClientSession() as session:
        streams = [asyncio.create_task(_stream(session, proxy_url(server))) for _ in range(3)]

        async def one_waiting() -> bool:
            doc = await get_json(f"{admin}/capacity")
            return bool(doc["in_use"] == 2 and doc["queued"] == 1)

        assert await until(one_waiting)

        async def waited_past_the_objective() -> bool:
            return bool((await get_json(f"{admin}/capacity"))["saturation"]["ttft"] > 1)

        assert await until(waited_past_the_objective)
        async with session.post(f"{proxy_url(server)}/v1/completions", json=BODY) as refused:
            assert refused.status == 429
        doc = await get_json(f"{admin}/capacity")
        assert doc["saturation"]["refusals"] == pytest.approx(2.0)
        assert doc["utilisation"] == pytest.approx(2.0)
        metrics = await scrape(f"{admin}/metrics")
        assert metrics["sidecar_utilisation"] == pytest.approx(2.0)
        assert metrics["sidecar_utilisation_term{term=refusals}"] == pytest.approx(2.0)
        for stream in streams:
            stream.cancel()
        await asyncio.gather(*streams, return_exceptions=True)


async def _stream(session: aiohttp.ClientSession, url: str, max_tokens: int = 28) -> None:
    body = json.dumps({**BODY, "stream": True, "max_tokens": max_tokens})
    headers = {"Content-Type": "application/json"}
    async with session.post(f"{url}/v1/completions", data=body, headers=headers) as response:
        async for _ in response.content:
            pass
