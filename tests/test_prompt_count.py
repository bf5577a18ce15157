"""SIDECAR_PROMPT_TOKENS=engine: the engine's /tokenize prices and bounds the prompt exactly."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import structlog
from aiohttp import web

from sidecar.edge.engine.pool import EnginePool
from sidecar.edge.proxy.prompt_count import EnginePromptCounter
from tests.servers import StartSidecar, admin_url, error_of, get_json, proxy_url, serve_app

MESSAGES = [{"role": "user", "content": "count these five words"}]


async def engine_count(engine: str, payload: dict[str, object]) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine}/tokenize", json=payload) as response,
    ):
        count: int = (await response.json())["count"]
        return count


async def test_token_mode_prices_the_engines_own_count(
    start_sidecar: StartSidecar, engine: str
) -> None:
    """The reserved KV bytes follow the engine's prompt count, not the byte estimate."""
    server = await start_sidecar(SIDECAR_ADMISSION="tokens", SIDECAR_PROMPT_TOKENS="engine")
    exact = await engine_count(engine, {"messages": MESSAGES, "add_generation_prompt": True})
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{proxy_url(server)}/v1/chat/completions",
            json={"model": "tiny-llama", "messages": MESSAGES, "stream": True, "max_tokens": 4},
            headers={"x-emulator-fault": "stall-after=1"},
        )
        await response.content.readuntil(b"\n\n")
        doc = await get_json(f"{admin_url(server)}/capacity")
        response.close()
    assert doc["in_use_cost"] == (exact + 4) * 1024


async def test_exact_count_over_the_prompt_budget_is_refused(
    start_sidecar: StartSidecar, engine: str
) -> None:
    """A prompt the estimate thinks fits but the engine counts over the budget gets a 400."""
    server = await start_sidecar(SIDECAR_PROMPT_TOKENS="engine")
    prompt = "a " * 150  # 300 bytes: about 75 tokens by the estimate, 150 by the engine
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy_url(server)}/v1/completions", json={"model": "tiny-llama", "prompt": prompt}
        ) as response,
    ):
        assert response.status == 400
        error = error_of(await response.read())
    assert error["code"] == "prompt_over_budget"
    assert "is 150 tokens" in error["message"]


@pytest.fixture
async def no_tokenize() -> AsyncIterator[EnginePool]:
    """An OpenAI-compatible server without /tokenize (every path 404s)."""
    runner, url = await serve_app(web.Application())
    upstream = EnginePool(url, connect_timeout_s=1, read_timeout_s=1)
    yield upstream
    upstream.close()
    await runner.cleanup()


async def test_engine_without_tokenize_falls_back_and_says_so_once(no_tokenize: EnginePool) -> None:
    """No /tokenize: the count is None (the estimate stays) and the warning is logged once."""
    counter = EnginePromptCounter(no_tokenize)
    with structlog.testing.capture_logs() as events:
        first = await counter.count({"prompt": "hi"}, {})
        second = await counter.count({"prompt": "hi"}, {})
    assert (first, second) == (None, None)
    levels = [e["log_level"] for e in events if e["event"] == "prompt_count_unavailable"]
    assert levels == ["warning", "debug"]
