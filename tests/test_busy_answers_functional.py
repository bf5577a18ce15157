"""Busy answers as the openai SDK acts on them, and `n` priced in count mode, over real sockets.

The SDK's own retry loop runs: it reads our ``retry-after-ms`` / ``Retry-After`` /
``x-should-retry`` and decides. Only its sleep is recorded instead of slept, so a test counts how
often it retried and how long it would have waited, without waiting.
"""

from __future__ import annotations

import asyncio
import json
import math
import types
from collections.abc import AsyncIterator

import aiohttp
import openai
import openai._base_client as sdk_client
import pytest

from sidecar.entry.app import SidecarServer
from tests.servers import (
    OpenAIFactory,
    StartSidecar,
    admin_url,
    error_of,
    get_json,
    proxy_url,
    sse_events,
    until,
)

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
    """Both permits held, no queue: the SDK asks 3 times (max_retries=2), waiting as
    retry-after-ms says. No release seen yet: the first refusal is told the one-second default
    with the two running taken to end within it, so each later refusal (its return still due)
    comes half a second later, jittered within its half second."""
    server = await start_sidecar()
    held = [await hold(session, server) for _ in range(2)]
    client = openai_client(proxy_url(server), max_retries=2)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    headers = caught.value.response.headers
    last_ms = int(headers["retry-after-ms"])
    assert 2000 <= last_ms <= 2500
    assert headers["retry-after"] == str(math.ceil(last_ms / 1000))
    assert headers["x-should-retry"] == "true"
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    assert [int(wait * 2) for wait in sdk_waits] == [2, 3]  # [1.0, 1.5) then [1.5, 2.0)
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


async def test_the_sdk_with_its_defaults_completes_a_refused_stream_on_its_own_retries(
    start_sidecar: StartSidecar,
    openai_client: OpenAIFactory,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK asks for JSON even for a stream: a full pod answers it 429 with the hint, which it
    honours (max_retries=2, its default); the permits free while it waits, and its retry streams
    to the end."""
    server = await start_sidecar()
    held = [await hold(session, server) for _ in range(2)]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:  # the wait told, spent freeing the pod instead
        waits.append(seconds)
        for response in held:
            response.close()
        assert await until(lambda: _idle(server))

    monkeypatch.setattr(sdk_client, "anyio", types.SimpleNamespace(sleep=sleep))
    client = openai.AsyncOpenAI(base_url=f"{proxy_url(server)}/v1", api_key="sk-test")
    assert client.max_retries == 2  # the SDK's own default, untouched
    try:
        stream = await client.chat.completions.create(**CHAT, stream=True)  # type: ignore[call-overload]
        chunks = [chunk async for chunk in stream]
    finally:
        await client.close()
    assert 1.0 <= waits[0] <= 1.5  # retry-after-ms: the one-second default, jittered
    assert chunks[-1].choices[0].finish_reason is not None
    assert server.bulkhead.snapshot().rejected == {"queue_full": 1}


async def _idle(server: SidecarServer) -> bool:
    return server.bulkhead.snapshot().in_use == 0


# What a browser's EventSource sends (WHATWG HTML, "The EventSource interface": Accept set to
# text/event-stream, the cache mode no-store, which browsers send as Cache-Control: no-cache).
EVENT_SOURCE = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}


async def test_an_event_stream_client_still_gets_the_fallback_event(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession
) -> None:
    """A client that asks for an event stream is answered in its own protocol: a 200 with one
    ``fallback`` event whose hint agrees, to the ms, with the headers beside it."""
    server = await start_sidecar()
    held = [await hold(session, server) for _ in range(2)]
    url = f"{proxy_url(server)}/v1/chat/completions"
    async with session.post(url, json={**CHAT, "stream": True}, headers=EVENT_SOURCE) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        events = sse_events(await response.read())
        headers = response.headers
    assert [name for name, _ in events] == ["fallback", None]
    data = json.loads(events[0][1])
    wait_ms = int(headers["retry-after-ms"])
    assert (data["error"]["code"], data["error"]["retry_after_ms"]) == ("queue_full", wait_ms)
    assert data["retry_after_s"] == wait_ms / 1000
    assert int(headers["Retry-After"]) == math.ceil(wait_ms / 1000)
    for response in held:
        response.close()


@pytest.mark.parametrize(
    ("env", "accept", "status"),
    [
        pytest.param({}, "application/json", 429, id="json"),
        pytest.param({}, None, 200, id="no-accept"),
        pytest.param({}, "*/*", 200, id="any"),
        pytest.param({"SIDECAR_REJECT_MODE": "http"}, "text/event-stream", 429, id="http-mode"),
    ],
)
async def test_the_busy_answer_follows_the_accept_header(
    start_sidecar: StartSidecar,
    session: aiohttp.ClientSession,
    env: dict[str, str],
    accept: str | None,
    status: int,
) -> None:
    """A refused stream: 429 where the client prefers JSON or the mode says http, the fallback
    event where it takes any type."""
    server = await start_sidecar(**env)
    held = [await hold(session, server) for _ in range(2)]
    url = f"{proxy_url(server)}/v1/chat/completions"
    # aiohttp adds "Accept: */*" unless told otherwise: SKIP_AUTO_HEADERS leaves it out.
    headers = {} if accept is None else {"Accept": accept}
    skip = () if accept is not None else ("Accept",)
    async with session.post(
        url, json={**CHAT, "stream": True}, headers=headers, skip_auto_headers=skip
    ) as response:
        assert response.status == status
        body = await response.read()
    if status == 429:
        assert error_of(body)["code"] == "queue_full"
    else:
        assert sse_events(body)[0][0] == "fallback"
    for response in held:
        response.close()
