"""Busy answers as the openai SDK acts on them, and `n` priced in count mode, over real sockets.

The SDK's own retry loop runs: it reads our ``retry-after-ms`` / ``Retry-After`` /
``x-should-retry`` and decides. Only its sleep is recorded instead of slept, so a test counts how
often it retried and how long it would have waited, without waiting.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator

import aiohttp
import openai
import openai._base_client as sdk_client
import pytest

from sidecar.entry.app import SidecarServer
from tests.servers import OpenAIFactory, StartSidecar, admin_url, error_of, get_json, proxy_url

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello there"}]}
STALL = {"x-emulator-fault": "stall-after=1"}  # the engine stops after one token: a held permit


@pytest.fixture
def sdk_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every delay the SDK's async retry loop asks to sleep, recorded and not slept."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(sdk_client, "anyio", types.SimpleNamespace(sleep=sleep))
    return waits


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def hold(session: aiohttp.ClientSession, server: SidecarServer) -> aiohttp.ClientResponse:
    """A stream the engine stalls after its first event: its permit stays held."""
    response = await session.post(
        f"{proxy_url(server)}/v1/chat/completions", json={**CHAT, "stream": True}, headers=STALL
    )
    assert response.status == 200
    await response.content.readuntil(b"\n\n")
    return response


async def test_the_sdk_retries_a_full_server_as_told_then_gives_up(
    start_sidecar: StartSidecar,
    openai_client: OpenAIFactory,
    session: aiohttp.ClientSession,
    sdk_waits: list[float],
) -> None:
    """Both permits held, no queue: the SDK asks 3 times (max_retries=2), waiting 1.0 s each time
    as retry-after-ms says (no releases seen yet: the hint's one-second default)."""
    server = await start_sidecar()
    held = [await hold(session, server) for _ in range(2)]
    client = openai_client(proxy_url(server), max_retries=2)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    headers = caught.value.response.headers
    assert (headers["retry-after-ms"], headers["retry-after"]) == ("1000", "1")
    assert headers["x-should-retry"] == "true"
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    assert sdk_waits == [1.0, 1.0]
    assert server.bulkhead.snapshot().rejected == {"queue_full": 3}
    for response in held:
        response.close()


async def test_the_sdk_never_retries_what_can_never_fit(
    start_sidecar: StartSidecar, openai_client: OpenAIFactory, sdk_waits: list[float]
) -> None:
    """n above every permit there is: one 400 too_large, x-should-retry false, no retry."""
    server = await start_sidecar()
    client = openai_client(proxy_url(server), max_retries=3)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(**CHAT, n=3, max_tokens=4)  # type: ignore[call-overload]
    assert caught.value.code == "too_large"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert sdk_waits == []
    assert server.bulkhead.snapshot().rejected == {"too_large": 1}


async def test_an_over_budget_request_says_not_to_retry(
    start_sidecar: StartSidecar, openai_client: OpenAIFactory, sdk_waits: list[float]
) -> None:
    """max_tokens over the budget: a 400 the SDK is told, and leaves, without a retry."""
    server = await start_sidecar()
    client = openai_client(proxy_url(server), max_retries=3)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(**CHAT, max_tokens=29)  # type: ignore[call-overload]
    assert caught.value.code == "max_tokens_over_budget"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert sdk_waits == []


async def test_count_mode_takes_a_permit_per_sequence(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession
) -> None:
    """n=2 holds both permits (so the next request is refused); n=3 can never fit: a 400."""
    server = await start_sidecar()
    body = {**CHAT, "n": 2, "stream": True, "max_tokens": 4}
    url = f"{proxy_url(server)}/v1/chat/completions"
    async with session.post(url, json=body, headers=STALL) as response:
        await response.content.readuntil(b"\n\n")
        doc = await get_json(f"{admin_url(server)}/capacity")
        assert (doc["in_use"], doc["in_use_cost"], doc["limit"]) == (1, 2, 2)
        async with session.post(url, json={**CHAT, "max_tokens": 4}) as refused:
            assert refused.status == 429
    async with session.post(url, json={**body, "n": 3}) as too_many:
        assert too_many.status == 400
        error = error_of(await too_many.read())
    assert error["code"] == "too_large"
    assert "lower n" in error["message"]


async def test_a_batch_of_prompts_counts_as_its_sequences(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession
) -> None:
    """A completions batch of 3 prompts needs 3 permits: above the 2 there are, refused at once."""
    server = await start_sidecar()
    body = {"model": "tiny-llama", "prompt": ["a", "b", "c"], "max_tokens": 4}
    async with session.post(f"{proxy_url(server)}/v1/completions", json=body) as response:
        assert response.status == 400
        assert error_of(await response.read())["code"] == "too_large"


# --- llm-d: objectives and their priorities, the TTFT target -------------------------------------

LLM_D = {
    "SIDECAR_MAX_QUEUE": "4",
    "SIDECAR_OBJECTIVE_PRIORITIES": "chat=10,batch=-1",
    "SIDECAR_CLAIMS_FROM": "127.0.0.1/32",  # the gateway: these tests' own loopback
}


async def test_a_negative_priority_objective_is_shed_at_once(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession
) -> None:
    """Full pod: the 'batch' objective (priority -1) is refused at once with llm-d's reason,
    though the queue has room; 'chat' (priority 10) would queue."""
    server = await start_sidecar(**LLM_D)
    held = [await hold(session, server) for _ in range(2)]
    headers = {"x-llm-d-inference-objective": "batch"}
    url = f"{proxy_url(server)}/v1/chat/completions"
    async with session.post(url, json={**CHAT, "max_tokens": 4}, headers=headers) as response:
        assert response.status == 429
        assert response.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
        assert error_of(await response.read())["code"] == "shed"
    assert server.bulkhead.snapshot().queued == 0
    for response in held:
        response.close()


async def test_a_ttft_target_caps_the_wait_in_the_queue(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession
) -> None:
    """x-slo-ttft-ms: 50 with a 3 s queue wait: told 'timeout' (rejected-ttl-expired) once its
    target has passed, long before the queue's own 3 s."""
    server = await start_sidecar(**LLM_D)
    held = [await hold(session, server) for _ in range(2)]
    url = f"{proxy_url(server)}/v1/chat/completions"
    async with asyncio.timeout(2):  # the bulkhead's own limit is 3 s: this must end first
        async with session.post(
            url, json={**CHAT, "max_tokens": 4}, headers={"x-slo-ttft-ms": "50"}
        ) as response:
            assert response.status == 429
            assert response.headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
            assert error_of(await response.read())["code"] == "timeout"
    for response in held:
        response.close()


async def test_a_streams_fallback_carries_the_retry_advice_to_the_sdk(
    start_sidecar: StartSidecar,
    openai_client: OpenAIFactory,
    session: aiohttp.ClientSession,
    sdk_waits: list[float],
) -> None:
    """A stream refused in-band: the SDK raises APIError (no retry: the answer was a 200) whose
    error object says should_retry and retry_after_ms, for the code that catches it."""
    server = await start_sidecar()
    held = [await hold(session, server) for _ in range(2)]
    client = openai_client(proxy_url(server), max_retries=2)
    stream = await client.chat.completions.create(**CHAT, stream=True)  # type: ignore[call-overload]
    with pytest.raises(openai.APIError) as caught:
        await anext(aiter(stream))
    body = caught.value.body
    assert isinstance(body, dict)
    advice = (body["code"], body["should_retry"], body["retry_after_ms"])
    assert advice == ("queue_full", True, 1000)
    assert sdk_waits == []
    for response in held:
        response.close()
