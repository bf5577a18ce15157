"""The emulated engine over real sockets, driven by the official openai SDK and raw aiohttp."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from emulator import EmulatorConfig, build_app

MODEL = "emulated-llama"
ServerFactory = Callable[..., Awaitable[TestServer]]


@pytest.fixture
async def start(aiohttp_server: ServerFactory) -> Callable[..., Awaitable[str]]:
    """Start an emulator with the given config changes; returns its base URL."""

    async def _start(**changes: Any) -> str:
        settings: dict[str, Any] = {"max_model_len": 256, "kv_tokens": 1024, "block_size": 16}
        config = EmulatorConfig(**(settings | changes))
        server = await aiohttp_server(build_app(config, poll_s=0.01))
        return f"http://{server.host}:{server.port}"

    return _start


@pytest.fixture
async def base_url(start: Callable[..., Awaitable[str]]) -> str:
    return await start()


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0) as c:
        yield c


async def scrape(base_url: str) -> dict[str, float]:
    """The unlabelled-by-reason vLLM gauges and counters, by sample name."""
    async with aiohttp.ClientSession() as session, session.get(f"{base_url}/metrics") as resp:
        text = await resp.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "finished_reason" not in sample.labels
    }


async def until(predicate: Callable[[], Awaitable[bool]]) -> None:
    """Poll a condition over HTTP for up to 2 s (a disconnect is noticed asynchronously)."""
    for _ in range(200):
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached within 2 s")


async def test_streaming_chat_with_usage(client: openai.AsyncOpenAI) -> None:
    """A chat stream has a role chunk, one token per chunk, finish_reason length, then usage."""
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "how many permits"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len(chunks) == 1 + 5 + 1
    assert [c.choices[0].finish_reason for c in chunks[1:6]] == [None] * 4 + ["length"]
    assert chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (10, 5)


async def test_streaming_completions_is_deterministic(client: openai.AsyncOpenAI) -> None:
    """The same prompt streams the same text; max_tokens chunks, the last with length."""

    async def run() -> list[str]:
        stream = await client.completions.create(
            model=MODEL, prompt="tell me a story", max_tokens=4, stream=True
        )
        return [chunk.choices[0].text async for chunk in stream]

    first, second = await run(), await run()
    assert first == second
    assert len(first) == 4


async def test_non_streaming_chat_and_completion(client: openai.AsyncOpenAI) -> None:
    """Non-streaming answers carry the full text and usage, like vLLM's."""
    chat = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].finish_reason == "length"
    assert len((chat.choices[0].message.content or "").split()) == 3
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 3
    completion = await client.completions.create(model=MODEL, prompt="one two", max_tokens=2)
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.total_tokens) == (2, 4)


async def test_max_tokens_defaults_to_what_is_left_of_max_model_len(
    client: openai.AsyncOpenAI,
) -> None:
    """Without max_tokens the answer runs to max_model_len (256 here) minus the prompt."""
    completion = await client.completions.create(model=MODEL, prompt="a b c d")
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 256 - 4


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param({"model": MODEL, "prompt": "x", "max_tokens": 300}, 400, id="over-context"),
        pytest.param({"model": MODEL, "prompt": "x", "max_tokens": -1}, 400, id="negative"),
        pytest.param({"model": MODEL, "prompt": ""}, 400, id="empty-prompt"),
        pytest.param({"model": "other", "prompt": "x"}, 404, id="unknown-model"),
    ],
)
async def test_bad_requests_get_openai_errors(
    base_url: str, body: dict[str, Any], status: int
) -> None:
    """Invalid requests get vLLM's status and an OpenAI error body, and change nothing."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base_url}/v1/completions", json=body) as resp,
    ):
        payload = await resp.json()
    assert resp.status == status
    assert payload["error"]["code"] == status
    assert (await scrape(base_url))["vllm:prompt_tokens_total"] == 0


async def test_models_health_and_tokenize(base_url: str) -> None:
    """The side endpoints answer in vLLM's shapes."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base_url}/health") as health:
            assert health.status == 200
        async with session.get(f"{base_url}/v1/models") as models:
            assert (await models.json())["data"][0]["id"] == MODEL
        async with session.post(f"{base_url}/tokenize", json={"prompt": "a b c"}) as tok:
            body = await tok.json()
        async with session.post(f"{base_url}/tokenize", json={"messages": []}) as chat_tok:
            chat_body = await chat_tok.json()
    assert body["count"] == len(body["tokens"]) == 3
    assert body["max_model_len"] == 256
    assert chat_body["count"] == 3


async def test_metrics_track_traffic(base_url: str, client: openai.AsyncOpenAI) -> None:
    """Token counters grow with traffic and the pool is empty again afterwards."""
    await client.completions.create(model=MODEL, prompt="a b c", max_tokens=7)
    metrics = await scrape(base_url)
    assert metrics["vllm:prompt_tokens_total"] == 3
    assert metrics["vllm:generation_tokens_total"] == 7
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0


async def test_oom_mode_ends_streams_in_band(start: Callable[..., Awaitable[str]]) -> None:
    """Out of KV in oom mode, the SDK raises on vLLM's in-band error chunk."""
    base_url = await start(oom=True, kv_tokens=256)
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0) as c:

        async def one() -> None:
            stream = await c.completions.create(
                model=MODEL, prompt="go", max_tokens=200, stream=True
            )
            async for _ in stream:
                pass

        results = await asyncio.gather(one(), one(), return_exceptions=True)
    assert any(isinstance(r, openai.APIError) and "out of memory" in r.message for r in results)
    metrics = await scrape(base_url)
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0


async def test_client_disconnect_mid_stream_aborts_and_frees(
    start: Callable[..., Awaitable[str]],
) -> None:
    """Closing a paced stream early aborts it: blocks freed, far fewer tokens than asked."""
    base_url = await start(tokens_per_s=200.0)
    body = {"model": MODEL, "prompt": "go", "max_tokens": 200, "stream": True}
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{base_url}/v1/completions", json=body)
        seen = 0
        async for line in response.content:
            seen += line.startswith(b"data:")
            if seen == 3:
                break
        response.close()

    async def idle() -> bool:
        metrics = await scrape(base_url)
        return metrics["vllm:num_requests_running"] == 0

    await until(idle)
    metrics = await scrape(base_url)
    assert metrics["vllm:kv_cache_usage_perc"] == 0.0
    assert metrics["vllm:generation_tokens_total"] < 200


async def test_queue_cap_answers_503_as_vllm_does(
    start: Callable[..., Awaitable[str]],
) -> None:
    """--max-num-queued-reqs 2: two unfinished requests (one running, one waiting behind a
    one-sequence engine) take both places; the third is refused at once with vLLM's 503 body,
    streaming or not, and once one finishes the next is let in."""
    url = await start(max_num_seqs=1, max_num_queued_reqs=2, tokens_per_s=20.0)
    body = {"model": MODEL, "prompt": "one two", "max_tokens": 10, "stream": True}
    async with aiohttp.ClientSession() as session:
        held = [asyncio.create_task(_drain(session, url, body)) for _ in range(2)]
        await until(lambda: _unfinished_at_least(url, 2))
        for stream in (True, False):
            async with session.post(f"{url}/v1/completions", json=body | {"stream": stream}) as r:
                refused = (r.status, await r.json(), r.headers.get("Retry-After"))
            assert refused == (
                503,
                {
                    "error": {
                        "message": "The engine is currently busy and cannot accept new requests. "
                        "Please try again later or on a different instance.",
                        "type": "Service Unavailable",
                        "param": None,
                        "code": 503,
                    }
                },
                None,
            )
        assert await asyncio.gather(*held) == [200, 200]
        assert await _drain(session, url, body) == 200


async def _drain(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with session.post(f"{url}/v1/completions", json=body) as response:
        await response.read()
        return response.status


async def _unfinished_at_least(url: str, count: int) -> bool:
    metrics = await scrape(url)
    running = metrics["vllm:num_requests_running"]
    return running + metrics["vllm:num_requests_waiting"] >= count


async def test_requests_are_counted_by_route_as_vllm_counts_them(base_url: str) -> None:
    """http_requests_total, as vLLM's /metrics has it: each request once, by its route, method
    and status class; a path with no route under "none"."""
    async with aiohttp.ClientSession() as session:
        for path in ("/v1/models", "/v1/models", "/nowhere"):
            async with session.get(f"{base_url}{path}") as response:
                await response.read()
        async with session.get(f"{base_url}/metrics") as resp:
            text = await resp.text()
    counted = {
        (s.labels["handler"], s.labels["method"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "http_requests"
        for s in family.samples
        if s.name == "http_requests_total"
    }
    assert counted == {("/v1/models", "GET", "2xx"): 2.0, ("none", "GET", "4xx"): 1.0}
