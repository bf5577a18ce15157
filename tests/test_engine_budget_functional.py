"""The engine's own limits as the default budget, and readiness that follows the engine, over
real sockets against the emulated engine (which states max_model_len on /v1/models, as vLLM does).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.entry.app import SidecarServer
from tests.servers import (
    StartSidecar,
    admin_url,
    error_of,
    get_json,
    proxy_url,
    refused_port,
    sidecars,
    until,
)

# The engine decides: the settings of tests/servers.py's BASE_ENV are unset ("" counts as unset).
ENGINE_DECIDES = {
    "SIDECAR_CAPACITY_SOURCE": "vllm",
    "SIDECAR_MAX_PROMPT_TOKENS": "",
    "SIDECAR_MAX_COMPLETION_TOKENS": "",
    "SIDECAR_KV_POOL": "",
}
MAX_MODEL_LEN = 2048
CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    """An emulated engine with a 2,048-token context and room for eight such requests."""
    config = EmulatorConfig(model_name="tiny-llama", max_model_len=MAX_MODEL_LEN, kv_tokens=16384)
    runner = web.AppRunner(build_app(config))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def chat(server: SidecarServer, **fields: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy_url(server)}/v1/chat/completions", json={**CHAT, **fields}) as r,
    ):
        return r.status, dict(r.headers), json.loads(await r.read())


async def test_the_engine_context_is_the_budget_when_nothing_narrows_it(
    start_sidecar: StartSidecar,
) -> None:
    """max_tokens 2,000 reaches an engine whose context is 2,048 (the old default refused it), and
    /capacity shows the budget and that it came from the engine."""
    server = await start_sidecar(**ENGINE_DECIDES)
    status, _headers, body = await chat(server, max_tokens=2000)
    assert status == 200, body
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert doc["budget"] == {
        "max_prompt_tokens": MAX_MODEL_LEN,
        "max_completion_tokens": MAX_MODEL_LEN,
        "request_max_tokens": MAX_MODEL_LEN,
        "engine_max_model_len": MAX_MODEL_LEN,
        "source": {"prompt": "engine", "completion": "engine"},
    }
    # 16,384 tokens of pool x alpha 1 / 2,048 a request: what vLLM calls "maximum concurrency".
    assert doc["permits"] == 8


async def test_a_request_without_max_tokens_is_left_for_the_engine_to_bound(
    start_sidecar: StartSidecar,
) -> None:
    """With the engine's own budget, a missing max_tokens is not filled with the whole context
    (the engine would refuse prompt + 2,048 > 2,048): the request is served."""
    server = await start_sidecar(**ENGINE_DECIDES)
    status, _headers, body = await chat(server)
    assert status == 200, body


async def test_max_tokens_past_the_engine_context_is_refused_by_the_sidecar(
    start_sidecar: StartSidecar,
) -> None:
    """What the engine would refuse anyway is refused before admission, naming the budget."""
    server = await start_sidecar(**ENGINE_DECIDES)
    status, headers, body = await chat(server, max_tokens=MAX_MODEL_LEN + 1)
    assert (status, headers["x-should-retry"]) == (400, "false")
    assert body["error"]["code"] == "max_tokens_over_budget"
    assert str(MAX_MODEL_LEN) in body["error"]["message"]


async def test_a_setting_narrows_the_engine_budget(start_sidecar: StartSidecar) -> None:
    """SIDECAR_MAX_COMPLETION_TOKENS=500 under a 2,048 context: 501 is refused, and /capacity
    names the setting as the source."""
    server = await start_sidecar(**{**ENGINE_DECIDES, "SIDECAR_MAX_COMPLETION_TOKENS": "500"})
    status, _headers, body = await chat(server, max_tokens=501)
    assert (status, body["error"]["code"]) == (400, "max_tokens_over_budget")
    budget = (await get_json(f"{admin_url(server)}/capacity"))["budget"]
    assert (budget["max_completion_tokens"], budget["source"]["completion"]) == (500, "setting")
    assert budget["request_max_tokens"] == MAX_MODEL_LEN  # 2,048 prompt + 500, within 2,048


async def test_a_setting_above_the_engine_context_is_narrowed_to_it(
    start_sidecar: StartSidecar,
) -> None:
    """A budget wider than the engine's context is the engine's: 9,000 becomes 2,048."""
    server = await start_sidecar(**{**ENGINE_DECIDES, "SIDECAR_MAX_COMPLETION_TOKENS": "9000"})
    budget = (await get_json(f"{admin_url(server)}/capacity"))["budget"]
    assert (budget["max_completion_tokens"], budget["source"]["completion"]) == (2048, "engine")


async def test_clamp_lowers_max_tokens_and_says_so(start_sidecar: StartSidecar) -> None:
    """SIDECAR_OVER_BUDGET=clamp: the request is served at the budget, and the answer's
    X-Sidecar-Max-Tokens-Clamped says to what; the engine generated no more than that."""
    server = await start_sidecar(
        **{**ENGINE_DECIDES, "SIDECAR_MAX_COMPLETION_TOKENS": "7", "SIDECAR_OVER_BUDGET": "clamp"}
    )
    status, headers, body = await chat(server, max_tokens=1500)
    assert status == 200, body
    assert headers["X-Sidecar-Max-Tokens-Clamped"] == "7"
    assert body["usage"]["completion_tokens"] <= 7
    status, headers, _body = await chat(server, max_tokens=5)
    assert (status, "X-Sidecar-Max-Tokens-Clamped" in headers) == (200, False)


async def _readyz(server: SidecarServer) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{admin_url(server)}/readyz") as response,
    ):
        return response.status, json.loads(await response.read())


async def test_ready_only_while_the_engine_answers() -> None:
    """Not ready (503, with why) before the engine has answered; ready once it has; not ready
    again once it stops answering (judged from the age of its last good reading)."""
    runner = web.AppRunner(build_app(EmulatorConfig(model_name="tiny-llama")))
    fast = {"SIDECAR_REFRESH_MS": "50", "SIDECAR_PROBE_TIMEOUT_MS": "200"}
    with refused_port() as port:
        async with sidecars(f"http://127.0.0.1:{port}") as start:
            server = await start(**ENGINE_DECIDES, **fast)
            status, body = await _readyz(server)
            assert (status, body["ready"]) == (503, False)
            assert body["reason"].startswith("the engine has not answered yet: engine at http")
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            assert await until(lambda: _ready_is(server, 200))
            await runner.cleanup()
            assert await until(lambda: _ready_is(server, 503))
            _status, body = await _readyz(server)
            assert "the engine has not answered for" in body["reason"]


async def _ready_is(server: SidecarServer, wanted: int) -> bool:
    return (await _readyz(server))[0] == wanted


async def test_requests_before_the_engine_answers_are_told_so() -> None:
    """With no engine the proxy still answers in the OpenAI shape (a 502 the SDK retries), never a
    hang or a traceback."""
    with refused_port() as port:
        async with sidecars(f"http://127.0.0.1:{port}") as start:
            server = await start(**ENGINE_DECIDES)
            status, _headers, body = await chat(server, max_tokens=5)
    assert status in (502, 503)
    assert error_of(json.dumps(body).encode())["type"] in ("upstream_error", "service_unavailable")
