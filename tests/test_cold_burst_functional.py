"""A burst on a fresh pod, over real sockets: the default admission in front of the emulated vLLM
lets in a burst four times its worst-case start without waiting for a control period and without
refusing any of it, and a sidecar that cannot grow its limit keeps it (the test can fail)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings
from tests.servers import BASE_ENV, admin_url, get_json, proxy_url, scrape, serve_app, until

BURST = 16
# A pool of 16,384 tokens and requests of up to 4,096: 4 worst-case permits to start with. The
# control period is a minute (BASE_ENV): within this test only a step the burst asks for can come.
ENV = {
    # The default queue; no declared pool: the engine's figures only.
    **{k: v for k, v in BASE_ENV.items() if k not in ("SIDECAR_MAX_QUEUE", "SIDECAR_KV_POOL")},
    "SIDECAR_CAPACITY_SOURCE": "vllm",
    "SIDECAR_MODEL": "",
    "SIDECAR_MAX_PROMPT_TOKENS": "2048",
    "SIDECAR_MAX_COMPLETION_TOKENS": "2048",
    "SIDECAR_SLO_TTFT_MS": "20000",  # a loaded test machine must not make the streams look late
    "SIDECAR_MAX_WAIT_MS": "20000",
}


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    """The emulated vLLM at 5 tokens a second a stream: a 50-token stream runs for 10 s."""
    config = EmulatorConfig(model_name="tiny", tokens_per_s=5, max_num_seqs=64)
    runner, url = await serve_app(build_app(config))
    yield url
    await runner.cleanup()


async def running_at(engine_url: str) -> float:
    metrics = await scrape(f"{engine_url}/metrics")
    return sum(v for k, v in metrics.items() if k.startswith("vllm:num_requests_running"))


async def stream(session: aiohttp.ClientSession, url: str) -> int:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 50, "stream": True}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        await response.read()
        return response.status


@pytest.mark.parametrize(
    ("admission", "runs"),
    [
        pytest.param("auto", BURST, id="slo-default: all 16 run within the period"),
        pytest.param("count", 4, id="count: the worst-case permits hold"),
    ],
)
async def test_a_burst_on_a_fresh_pod_runs_before_the_next_tick(
    engine: str, admission: str, runs: int
) -> None:
    """Sixteen streams at once where four fit the worst case: the default admission steps at
    once while they wait and all sixteen run at the engine, none refused; count admission, whose
    limit cannot grow, runs four and queues the rest."""
    server = SidecarServer(
        load_settings({**ENV, "SIDECAR_UPSTREAM_URL": engine, "SIDECAR_ADMISSION": admission})
    )
    await server.start()
    try:
        assert (await get_json(f"{admin_url(server)}/capacity"))["worst_case_permits"] == 4
        async with aiohttp.ClientSession() as session:
            streams = [
                asyncio.create_task(stream(session, proxy_url(server))) for _ in range(BURST)
            ]

            async def settled() -> bool:
                doc = await get_json(f"{admin_url(server)}/capacity")
                return bool((doc["in_use"], doc["queued"]) == (runs, BURST - runs))

            async def all_running() -> bool:
                return await running_at(engine) >= runs

            assert await until(settled, timeout_s=8.0)
            assert await until(all_running, timeout_s=8.0)
            assert await running_at(engine) == runs
            for task in streams:
                task.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
        metrics = await scrape(f"{admin_url(server)}/metrics")
        refused = {
            key: value
            for key, value in metrics.items()
            if key.startswith("sidecar_requests_total")
            and "outcome=client_gone" not in key
            and value
        }
        assert refused == {}  # none ended but by the test's own cancel: no refusal of any kind
    finally:
        await server.stop()
