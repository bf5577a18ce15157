"""Issue 48 row 7: `n`, `best_of` and completions batches are priced as the sequences they pin, in
every admission mode, and what the KV pool can never hold is refused with 400 `too_large` before
admission, over real sockets: none of it reaches the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.servers import StartSidecar, error_of, proxy_url

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 4}
MODES = ["slo", "count", "tokens", "adaptive"]
# BASE_ENV's pool: 256 tokens, of 1 KiB each; a request's budget is 100 + 28 tokens.
ABSURD = [
    pytest.param("chat/completions", {**CHAT, "n": 10**6}, id="n-million"),
    pytest.param("chat/completions", {**CHAT, "n": 2**63}, id="n-2^63"),
    pytest.param("completions", {**COMPLETION, "best_of": 10**6}, id="best-of-million"),
    pytest.param("completions", {**COMPLETION, "prompt": ["a"] * 100_000}, id="batch-100k"),
    pytest.param("completions", {**COMPLETION, "prompt": [[1, 2]] * 100_000}, id="batch-ids-100k"),
    pytest.param("chat/completions", {**CHAT, "n": 65, "max_tokens": 1}, id="n-past-pool"),
]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, dict[str, str], bytes]:
    async with session.post(url, json=body) as response:
        return response.status, dict(response.headers), await response.read()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("path", "body"), ABSURD)
async def test_what_the_pool_can_never_hold_is_too_large_in_every_mode(
    start_sidecar: StartSidecar,
    session: aiohttp.ClientSession,
    mode: str,
    path: str,
    body: dict[str, Any],
) -> None:
    """More sequences than the KV pool can ever hold at their worst case: 400 too_large at once,
    told not to retry, never admitted nor forwarded."""
    server = await start_sidecar(SIDECAR_ADMISSION=mode)
    status, headers, raw = await _post(session, f"{proxy_url(server)}/v1/{path}", body)
    assert status == 400, raw[:300]
    assert headers["x-should-retry"] == "false"
    error = error_of(raw)
    assert (error["code"], error["type"]) == ("too_large", "invalid_request_error")
    assert server.bulkhead.snapshot().granted_total == 0


@pytest.mark.parametrize("mode", MODES)
async def test_sequences_the_pool_holds_are_served(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession, mode: str
) -> None:
    """Two short sequences fit every mode: served, with both choices."""
    server = await start_sidecar(SIDECAR_ADMISSION=mode)
    status, _, raw = await _post(
        session, f"{proxy_url(server)}/v1/chat/completions", {**CHAT, "n": 2}
    )
    assert status == 200, raw[:300]
