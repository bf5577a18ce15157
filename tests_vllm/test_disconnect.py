"""A client that goes away mid-stream: the sidecar closes upstream and vLLM stops generating."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import openai
import scrape
from conftest import Stack

POLL_S = 0.05


async def _engine(http: aiohttp.ClientSession, stack: Stack) -> tuple[float, float]:
    """(requests running, generated tokens so far) as vLLM reports them."""
    text = await scrape.fetch_text(http, f"{stack.vllm_url}/metrics")
    return (
        scrape.total(text, "vllm:num_requests_running"),
        scrape.total(text, "vllm:generation_tokens_total", default=0),
    )


async def _within(seconds: float, check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` until it holds; fail the test if it does not within ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await check():
        assert loop.time() < deadline, f"not within {seconds}s: {what}"
        await asyncio.sleep(POLL_S)


# vLLM on a starved CPU sometimes sends a whole answer in one burst at its end; a client cannot
# hang up mid-stream then. Four sequences per request make the stream last longer, and a try
# whose answer was already whole when the client left proves nothing and is made again.
SEQUENCES = 2  # the sidecar's permits: count mode charges a permit per sequence
ATTEMPTS = 5


async def test_disconnect_aborts_the_request_in_vllm(
    stack: Stack, via_sidecar: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    """After the client closes its stream, vLLM runs nothing and generates no more tokens."""
    whole = SEQUENCES * stack.max_completion_tokens
    for _ in range(ATTEMPTS):
        await _within(5.0, lambda: _idle(http, stack), "vLLM idle before the test")
        _, tokens_before = await _engine(http, stack)
        chunks = await _hang_up_after(via_sidecar, stack, 4)
        await _within(1.0, lambda: _idle(http, stack), "vLLM's running count back to 0")
        _, tokens_at_abort = await _engine(http, stack)
        if tokens_at_abort - tokens_before < whole:
            break
    await asyncio.sleep(0.5)  # the real engine's own pace; no clock to inject here
    _, tokens_later = await _engine(http, stack)
    assert tokens_later == tokens_at_abort
    # The first chat chunk of each sequence carries only the assistant role, no token.
    assert chunks - SEQUENCES <= tokens_at_abort - tokens_before < whole


async def _hang_up_after(client: openai.AsyncOpenAI, stack: Stack, wanted: int) -> int:
    """Open a long chat stream, read ``wanted`` chunks, close it at once; the chunks read."""
    stream = await client.chat.completions.create(
        model=stack.served_model,
        messages=[{"role": "user", "content": "Tell a very long story."}],
        stream=True,
        max_tokens=stack.max_completion_tokens,
        n=SEQUENCES,  # vLLM refuses n > 1 with greedy sampling: the default temperature it is
        extra_body={"ignore_eos": True},
    )
    chunks = 0
    async for _chunk in stream:
        chunks += 1
        if chunks == wanted:
            break
    # Close at once: on a busy CI machine even one metrics scrape first can outlast the stream.
    await stream.close()
    assert chunks == wanted
    return chunks


async def test_disconnect_returns_the_permit(
    stack: Stack, via_sidecar: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    """The permit of a client that went away is free again at once."""
    for _ in range(ATTEMPTS):
        gone = (await scrape.outcomes(http, stack.admin_url)).get("client_gone", 0)
        stream = await via_sidecar.completions.create(
            model=stack.served_model,
            prompt="Once upon a time",
            stream=True,
            max_tokens=stack.max_completion_tokens,
            n=SEQUENCES,
            extra_body={"ignore_eos": True},
        )
        async for _chunk in stream:
            break
        # Close at once: a scrape first can outlast the stream on a busy machine. Whether the
        # client left mid-stream is the sidecar's own outcome for the request.
        await stream.close()
        await _within(1.0, lambda: _permit_free(http, stack), "the permit released")
        if (await scrape.outcomes(http, stack.admin_url)).get("client_gone", 0) > gone:
            return
        # The whole answer was relayed before the client left: that proves nothing; again.
    raise AssertionError(f"every stream was whole before its client left, in {ATTEMPTS} tries")


async def _idle(http: aiohttp.ClientSession, stack: Stack) -> bool:
    return (await _engine(http, stack))[0] == 0


async def _capacity_in_use(http: aiohttp.ClientSession, stack: Stack) -> int:
    in_use: int = (await scrape.capacity(http, stack.admin_url))["in_use"]
    return in_use


async def _permit_free(http: aiohttp.ClientSession, stack: Stack) -> bool:
    return await _capacity_in_use(http, stack) == 0
