"""/capacity states each limit beside what is held of it, in one unit each: requests in flight,
and in slo admission the streams starting (admitted, not yet at their first token)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings
from tests.servers import BASE_ENV, StartSidecar, admin_url, get_json, proxy_url, serve_app, until

# The default admission (slo) on the engine's own figures, as tests/test_cold_burst_functional.py.
SLO_ENV = {
    **{k: v for k, v in BASE_ENV.items() if k not in ("SIDECAR_MAX_QUEUE", "SIDECAR_KV_POOL")},
    "SIDECAR_CAPACITY_SOURCE": "vllm",
    "SIDECAR_ADMISSION": "slo",
    "SIDECAR_MODEL": "",
    "SIDECAR_MAX_PROMPT_TOKENS": "2048",
    "SIDECAR_MAX_COMPLETION_TOKENS": "2048",
    "SIDECAR_SLO_TTFT_MS": "20000",
}
BODY = {"model": "tiny", "prompt": "hi", "max_tokens": 50, "stream": True}
LATE_FIRST_TOKEN = {"x-emulator-fault": "slow-first-token=30"}


@pytest.fixture
async def slow_engine() -> AsyncIterator[str]:
    """The emulated vLLM at 5 tokens a second a stream: a 50-token stream runs for 10 s."""
    config = EmulatorConfig(model_name="tiny", tokens_per_s=5)
    runner, url = await serve_app(build_app(config))
    yield url
    await runner.cleanup()


async def _stream(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> None:
    async with session.post(f"{url}/v1/completions", json=BODY, headers=headers) as response:
        await response.read()


async def test_slo_states_in_flight_and_starting_side_by_side(slow_engine: str) -> None:
    """One stream past its first token, one still waiting for it: two requests in flight, one
    stream starting; the starting limit is the top-level limit, in its own unit."""
    server = SidecarServer(load_settings({**SLO_ENV, "SIDECAR_UPSTREAM_URL": slow_engine}))
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            url = proxy_url(server)
            tasks = [
                asyncio.create_task(_stream(session, url, {})),
                asyncio.create_task(_stream(session, url, LATE_FIRST_TOKEN)),
            ]

            async def one_started_one_starting() -> bool:
                doc = await get_json(f"{admin_url(server)}/capacity")
                return bool(doc["in_flight"]["in_use"] == 2 and doc["starting"]["in_use"] == 1)

            assert await until(one_started_one_starting, timeout_s=10)
            doc = await get_json(f"{admin_url(server)}/capacity")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await server.stop()
    assert doc["limit_unit"] == "starting_streams"
    assert doc["starting"] == {"unit": "streams", "limit": doc["limit"], "in_use": 1}
    in_flight = doc["in_flight"]
    assert (in_flight["unit"], in_flight["in_use"]) == ("requests", 2)
    assert in_flight["limit"] is None or in_flight["limit"] >= doc["limit"]
    # The fields users read before stay, meaning what they meant.
    assert (doc["in_use"], doc["in_use_cost"]) == (2, 1)


async def test_count_states_its_one_limit_in_sequences(start_sidecar: StartSidecar) -> None:
    """Count admission has one limit, in sequences: in flight beside it, nothing starting."""
    server = await start_sidecar()
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert doc["in_flight"] == {"unit": "sequences", "limit": 2, "in_use": 0}
    assert doc["starting"] is None
