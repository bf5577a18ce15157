"""The proxy over real sockets: the official openai SDK -> sidecar -> emulated engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable

import aiohttp
import openai
import pytest

from sidecar.entry.app import SidecarServer
from tests.servers import (
    OpenAIFactory,
    StartSidecar,
    admin_url,
    error_of,
    get_json,
    proxy_url,
    scrape,
    sse_events,
    until,
)

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello there"}]}
STALL = {"x-emulator-fault": "stall-after=1"}


@pytest.fixture
def client_for(openai_client: OpenAIFactory) -> OpenAIFactory:
    """The openai SDK client factory, under a shorter name."""
    return openai_client


async def consume(client: openai.AsyncOpenAI, into: list[object] | None = None) -> None:
    """Stream a chat completion to its end through the SDK, keeping the chunks in ``into``."""
    stream = await client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "hello there"}],
        stream=True,
    )
    async for chunk in stream:
        if into is not None:
            into.append(chunk)


async def in_use(server: SidecarServer) -> int:
    doc = await get_json(f"{admin_url(server)}/capacity")
    return int(doc["in_use"])


async def hold_stream(session: aiohttp.ClientSession, base: str) -> aiohttp.ClientResponse:
    """Open a stream the engine stalls after its first token, so its permit stays held."""
    response = await session.post(
        f"{base}/v1/chat/completions", json={**CHAT, "stream": True}, headers=STALL
    )
    assert response.status == 200
    await response.content.readuntil(b"\n\n")
    return response


async def test_sdk_stream_through_sidecar_matches_engine(
    start_sidecar: StartSidecar, client_for: OpenAIFactory, engine: str
) -> None:
    """Streaming chat through the sidecar yields exactly the engine's tokens."""
    server = await start_sidecar()

    async def collect(base: str) -> str:
        stream = await client_for(base).chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "hello there"}],
            stream=True,
            max_tokens=12,
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    via_sidecar, direct = await collect(proxy_url(server)), await collect(engine)
    assert via_sidecar == direct
    assert via_sidecar.strip()
    assert await in_use(server) == 0


async def test_missing_max_tokens_is_set_to_the_budget(
    start_sidecar: StartSidecar, client_for: OpenAIFactory
) -> None:
    """A request without max_tokens is capped at the completion budget before it is forwarded."""
    server = await start_sidecar()
    completion = await client_for(proxy_url(server)).completions.create(
        model="tiny-llama", prompt="once upon a time"
    )
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 28


async def test_a_refused_sdk_stream_is_a_rate_limit_error(
    start_sidecar: StartSidecar, client_for: OpenAIFactory
) -> None:
    """With every permit held and no queue, the SDK's stream (it asks for JSON) gets a 429: its
    RateLimitError carries our code."""
    server = await start_sidecar()
    async with aiohttp.ClientSession() as session:
        held = [await hold_stream(session, proxy_url(server)) for _ in range(2)]
        with pytest.raises(openai.RateLimitError, match="queue") as caught:
            await consume(client_for(proxy_url(server)))
        assert caught.value.code == "queue_full"
        for response in held:
            response.close()
    assert await until(lambda: _is(in_use(server), 0))


async def _is(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def test_fallback_wire_format(start_sidecar: StartSidecar) -> None:
    """The fallback is a 200 SSE stream: one `fallback` event with an OpenAI error, then [DONE]."""
    server = await start_sidecar()
    async with aiohttp.ClientSession() as session:
        held = [await hold_stream(session, proxy_url(server)) for _ in range(2)]
        async with session.post(
            f"{proxy_url(server)}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as response:
            body = await response.read()
            assert response.status == 200
            assert response.content_type == "text/event-stream"
            assert int(response.headers["Retry-After"]) >= 1
        for r in held:
            r.close()
    (event, data), done = sse_events(body)
    assert event == "fallback"
    payload = json.loads(data)
    assert payload["error"]["code"] == "queue_full"
    assert payload["retry_after_s"] > 0
    assert done == (None, "[DONE]")


async def test_non_streaming_busy_is_429_rate_limit_error(
    start_sidecar: StartSidecar, client_for: OpenAIFactory
) -> None:
    """A non-streaming request turned away gets 429 + Retry-After: the SDK's RateLimitError."""
    server = await start_sidecar()
    async with aiohttp.ClientSession() as session:
        held = [await hold_stream(session, proxy_url(server)) for _ in range(2)]
        with pytest.raises(openai.RateLimitError) as caught:
            await client_for(proxy_url(server)).chat.completions.create(
                model="tiny-llama",
                messages=CHAT["messages"],  # type: ignore[arg-type]
            )
        assert int(caught.value.response.headers["Retry-After"]) >= 1
        for r in held:
            r.close()


async def test_http_reject_mode_answers_streams_with_429(start_sidecar: StartSidecar) -> None:
    """SIDECAR_REJECT_MODE=http turns streaming requests away with 429 too."""
    server = await start_sidecar(SIDECAR_REJECT_MODE="http")
    async with aiohttp.ClientSession() as session:
        held = [await hold_stream(session, proxy_url(server)) for _ in range(2)]
        async with session.post(
            f"{proxy_url(server)}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as response:
            assert response.status == 429
            assert error_of(await response.read())["code"] == "queue_full"
        for r in held:
            r.close()


async def test_queued_request_is_granted_when_a_stream_ends(
    start_sidecar: StartSidecar, client_for: OpenAIFactory
) -> None:
    """A request that waits in the queue runs as soon as a running stream finishes."""
    server = await start_sidecar(SIDECAR_MAX_QUEUE="4")
    async with aiohttp.ClientSession() as session:
        held = [await hold_stream(session, proxy_url(server)) for _ in range(2)]
        waiting = asyncio.ensure_future(
            client_for(proxy_url(server)).completions.create(
                model="tiny-llama", prompt="hi", max_tokens=3
            )
        )
        assert await until(lambda: _queued(server, 1))
        held[0].close()
        completion = await asyncio.wait_for(waiting, 5)
        assert completion.choices[0].text
        held[1].close()


async def test_a_queued_client_that_hangs_up_leaves_the_queue(
    start_sidecar: StartSidecar,
) -> None:
    """Hanging up while queued cancels the handler at once: the waiter is gone, never granted
    (its queue deadline is a minute away, so only the hang-up can have taken it out)."""
    server = await start_sidecar(SIDECAR_MAX_QUEUE="4", SIDECAR_MAX_WAIT_MS="60000")
    async with aiohttp.ClientSession() as session:
        held = [await hold_stream(session, proxy_url(server)) for _ in range(2)]
        granted = server.bulkhead.snapshot().granted_total
        raw = json.dumps({**CHAT, "stream": True}).encode()
        _, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(raw), raw)
        )
        assert await until(lambda: _queued(server, 1))
        writer.close()
        assert await until(lambda: _queued(server, 0))
        assert server.bulkhead.snapshot().granted_total == granted
        for response in held:
            response.close()


async def _queued(server: SidecarServer, expected: int) -> bool:
    doc = await get_json(f"{admin_url(server)}/capacity")
    return bool(doc["queued"] == expected)


async def test_client_disconnect_releases_permit_and_aborts_engine(
    start_sidecar: StartSidecar, engine: str
) -> None:
    """A client that hangs up mid-stream frees its permit and the engine stops its request."""
    server = await start_sidecar()
    async with aiohttp.ClientSession() as session:
        response = await hold_stream(session, proxy_url(server))
        assert await in_use(server) == 1
        response.close()
    assert await until(lambda: _is(in_use(server), 0))

    async def engine_idle() -> bool:
        return (await scrape(f"{engine}/metrics"))[
            "vllm:num_requests_running{engine=0,model_name=tiny-llama}"
        ] == 0

    assert await until(engine_idle)
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_requests_total{outcome=client_gone}"] == 1


async def test_upstream_reset_mid_stream_ends_stream_in_band(
    start_sidecar: StartSidecar, client_for: OpenAIFactory
) -> None:
    """An engine that drops the connection mid-stream: a clear SDK APIError, permit freed."""
    server = await start_sidecar()
    client = client_for(proxy_url(server), default_headers={"x-emulator-fault": "reset-after=3"})
    received: list[object] = []
    with pytest.raises(openai.APIError, match="unreachable"):
        await consume(client, into=received)
    assert received, "the tokens sent before the reset reached the client"
    assert await in_use(server) == 0
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_requests_total{outcome=upstream_unavailable}"] == 1


async def test_upstream_stall_times_out_in_band(
    start_sidecar: StartSidecar, client_for: OpenAIFactory
) -> None:
    """An engine that stalls mid-stream past the read timeout: in-band error, permit freed."""
    server = await start_sidecar(SIDECAR_UPSTREAM_READ_TIMEOUT_MS="300")
    client = client_for(proxy_url(server), default_headers={"x-emulator-fault": "stall-after=2"})
    with pytest.raises(openai.APIError, match="in time"):
        await consume(client)
    assert await in_use(server) == 0


async def test_slow_non_streaming_upstream_is_504(start_sidecar: StartSidecar) -> None:
    """A non-streaming request whose engine does not answer in time gets 504, OpenAI-shaped."""
    server = await start_sidecar(SIDECAR_UPSTREAM_READ_TIMEOUT_MS="200")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy_url(server)}/v1/completions",
            json={"model": "tiny-llama", "prompt": "hi"},
            headers={"x-emulator-fault": "slow-first-token=2"},
        ) as response,
    ):
        assert response.status == 504
        assert error_of(await response.read())["code"] == "upstream_timeout"
    assert await in_use(server) == 0


async def test_upstream_down_is_502(start_sidecar: StartSidecar, client_for: OpenAIFactory) -> None:
    """With nothing listening upstream, completions get 502 with an OpenAI-shaped body."""
    server = await start_sidecar(SIDECAR_UPSTREAM_URL="http://127.0.0.1:9")
    with pytest.raises(openai.APIStatusError) as caught:
        await client_for(proxy_url(server)).completions.create(model="tiny-llama", prompt="hi")
    assert caught.value.status_code == 502
    assert await in_use(server) == 0


async def test_upstream_error_status_passes_through(start_sidecar: StartSidecar) -> None:
    """An engine error status reaches the client as it is."""
    server = await start_sidecar()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy_url(server)}/v1/completions",
            json={"model": "tiny-llama", "prompt": "hi"},
            headers={"x-emulator-fault": "status=503"},
        ) as response,
    ):
        assert response.status == 503
        assert "error" in json.loads(await response.read())
    assert await in_use(server) == 0


async def test_other_paths_pass_through_without_a_permit(
    start_sidecar: StartSidecar, client_for: OpenAIFactory
) -> None:
    """/v1/models is forwarded even while every permit is held."""
    server = await start_sidecar()
    async with aiohttp.ClientSession() as session:
        held = [await hold_stream(session, proxy_url(server)) for _ in range(2)]
        models = await client_for(proxy_url(server)).models.list()
        assert [m.id for m in models.data] == ["tiny-llama"]
        for r in held:
            r.close()


async def test_token_mode_admits_short_requests_beyond_the_count_limit(
    start_sidecar: StartSidecar,
) -> None:
    """Token-weighted admission prices each request's own tokens: short streams fit 2x and more."""
    server = await start_sidecar(SIDECAR_ADMISSION="tokens")
    short = {**CHAT, "stream": True, "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        held = []
        for _ in range(4):
            response = await session.post(
                f"{proxy_url(server)}/v1/chat/completions", json=short, headers=STALL
            )
            assert response.content_type == "text/event-stream"
            first = await response.content.readuntil(b"\n\n")
            assert b"fallback" not in first
            held.append(response)
        doc = await get_json(f"{admin_url(server)}/capacity")
        assert doc["in_use"] == 4
        # "hello there": 11 bytes = 3 tokens, + 4 of chat template, + max_tokens 4 = 11 tokens each
        assert doc["in_use_cost"] == 4 * 11 * 1024
        for response in held:
            response.close()


async def test_token_mode_rejects_a_request_larger_than_the_pool(
    start_sidecar: StartSidecar,
) -> None:
    """A request whose worst case exceeds the whole pool is refused at once as too_large."""
    server = await start_sidecar(SIDECAR_ADMISSION="tokens")
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy_url(server)}/v1/completions",
            json={"model": "tiny-llama", "prompt": "x" * 400, "n": 3},  # 3 x 128 tokens > 256
        ) as response,
    ):
        assert (response.status, response.headers["x-should-retry"]) == (400, "false")
        assert error_of(await response.read())["code"] == "too_large"


async def test_shadow_mode_lets_everything_through_but_counts(start_sidecar: StartSidecar) -> None:
    """In shadow mode a request over the limit still runs; the would-be rejection is counted."""
    server = await start_sidecar(SIDECAR_SHADOW="true")
    async with aiohttp.ClientSession() as session:
        held = [await hold_stream(session, proxy_url(server)) for _ in range(3)]
        metrics = await scrape(f"{admin_url(server)}/metrics")
        for response in held:
            response.close()
    assert metrics["sidecar_shadow_rejections_total{reason=queue_full}"] == 1
    assert metrics["sidecar_shadow_mode"] == 1


async def test_tenant_header_selects_its_compartment(start_sidecar: StartSidecar) -> None:
    """A request carrying x-tenant-id, from a trusted peer, runs in that tenant's compartment."""
    server = await start_sidecar(SIDECAR_COMPARTMENTS="gold=50%", SIDECAR_CLAIMS_FROM="127.0.0.1")
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{proxy_url(server)}/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={**STALL, "x-tenant-id": "gold"},
        )
        await response.content.readuntil(b"\n\n")
        doc = await get_json(f"{admin_url(server)}/capacity")
        response.close()
    parts = {part["name"]: part for part in doc["compartments"]}
    assert parts["gold"]["in_use"] == 1
    assert parts["default"]["in_use"] == 0


async def test_sheddable_gateway_objective_is_refused_at_once_while_others_queue(
    start_sidecar: StartSidecar,
) -> None:
    """With the permit taken, a sheddable objective gets a busy answer now; a normal one waits."""
    server = await start_sidecar(
        SIDECAR_KV_POOL="131072",
        SIDECAR_MAX_QUEUE="2",
        SIDECAR_SHEDDABLE="batch",
        SIDECAR_CLAIMS_FROM="127.0.0.0/8",
    )
    async with aiohttp.ClientSession() as session:
        holder = await hold_stream(session, proxy_url(server))
        shed = await session.post(
            f"{proxy_url(server)}/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={"x-gateway-inference-objective": "batch"},
        )
        fallback = await shed.text()
        queued = asyncio.ensure_future(
            session.post(f"{proxy_url(server)}/v1/chat/completions", json={**CHAT, "stream": True})
        )
        assert await until(lambda: _queued(server, 1))
        holder.close()
        answer = await asyncio.wait_for(queued, 5)
        body = await answer.text()
    assert (
        shed.headers["X-Sidecar-Outcome"],
        json.loads(fallback.split("data: ")[1])["error"]["code"],
    ) == ("shed", "shed")
    assert answer.status == 200
    assert body.rstrip().endswith("data: [DONE]")
    assert "fallback" not in body


async def test_streams_are_timed_and_whole_answers_are_not(
    start_sidecar: StartSidecar, client_for: OpenAIFactory
) -> None:
    """Each completed stream adds one TTFT (client's and engine's) and one TPOT observation;
    a non-streaming answer has no first token to time."""
    server = await start_sidecar()
    client = client_for(proxy_url(server))
    await consume(client)
    await consume(client)
    await client.completions.create(model="tiny-llama", prompt="once upon a time", max_tokens=4)
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_time_to_first_token_seconds_count"] == 2
    assert metrics["sidecar_engine_time_to_first_token_seconds_count"] == 2
    assert metrics["sidecar_time_per_output_token_seconds_count"] == 2
    client_ttft = metrics["sidecar_time_to_first_token_seconds_sum"]
    assert client_ttft >= metrics["sidecar_engine_time_to_first_token_seconds_sum"] > 0
