"""A request over the completion budget is refused by the sidecar and never reaches vLLM."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
import scrape
from conftest import Stack


async def _engine_counts(http: aiohttp.ClientSession, stack: Stack) -> tuple[float, float]:
    """(HTTP requests vLLM answered on the generation paths, prompt tokens it processed)."""
    text = await scrape.fetch_text(http, f"{stack.vllm_url}/metrics")
    requests = sum(
        scrape.total(text, "http_requests_total", default=0, handler=path)
        for path in ("/v1/chat/completions", "/v1/completions")
    )
    return requests, scrape.total(text, "vllm:prompt_tokens_total", default=0)


async def _invalid_count(http: aiohttp.ClientSession, stack: Stack) -> float:
    """How many requests the sidecar itself refused as invalid, from its /metrics."""
    text = await scrape.fetch_text(http, f"{stack.admin_url}/metrics")
    return scrape.total(text, "sidecar_requests_total", outcome="invalid")


@pytest.mark.parametrize("stream", [pytest.param(False, id="plain"), pytest.param(True, id="sse")])
async def test_over_budget_is_refused_before_vllm(
    stack: Stack, via_sidecar: openai.AsyncOpenAI, http: aiohttp.ClientSession, stream: bool
) -> None:
    """max_tokens one over SIDECAR_MAX_COMPLETION_TOKENS: a 400 error, and vLLM sees nothing."""
    before = await _engine_counts(http, stack)
    invalid_before = await _invalid_count(http, stack)
    with pytest.raises(openai.BadRequestError) as refused:
        await via_sidecar.chat.completions.create(
            model=stack.served_model,
            messages=[{"role": "user", "content": "Write far too much."}],
            max_tokens=stack.max_completion_tokens + 1,
            stream=stream,
        )
    assert refused.value.status_code == 400
    assert isinstance(refused.value.body, dict)
    assert refused.value.body.get("message")
    assert await _engine_counts(http, stack) == before
    assert await _invalid_count(http, stack) == invalid_before + 1


async def test_within_budget_reaches_vllm(
    stack: Stack, via_sidecar: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    """The same request at exactly the budget is served, so the refusal above is the budget's."""
    before_requests, _ = await _engine_counts(http, stack)
    stream = await via_sidecar.chat.completions.create(
        model=stack.served_model,
        messages=[{"role": "user", "content": "Write far too much."}],
        max_tokens=stack.max_completion_tokens,
        stream=True,
    )
    async for chunk in stream:
        assert chunk.choices[0].delta.role == "assistant"
        break
    await stream.close()  # one chunk proves vLLM took it; no need to wait for the rest
    # vLLM counts an HTTP request when its response ends, a moment after the abort.
    deadline = asyncio.get_running_loop().time() + 5.0
    while (await _engine_counts(http, stack))[0] == before_requests:
        assert asyncio.get_running_loop().time() < deadline, "vLLM never counted the request"
        await asyncio.sleep(0.05)
    assert (await _engine_counts(http, stack))[0] == before_requests + 1
