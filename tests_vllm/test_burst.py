"""A burst of several times the permit count: the queue lives in the sidecar, not in vLLM."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import scrape
from conftest import Stack

GENERATED = 96
POLL_S = 0.05


@dataclass(frozen=True)
class Outcome:
    """What one client of the burst saw: a complete stream, or the sidecar's busy answer."""

    completion_tokens: int | None = None
    finish_reason: str | None = None
    busy_error: Mapping[str, Any] | None = None


async def _one(client: openai.AsyncOpenAI, stack: Stack, index: int) -> Outcome:
    try:
        stream = await client.chat.completions.create(
            model=stack.served_model,
            messages=[{"role": "user", "content": f"Client {index} asks about the weather."}],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=GENERATED,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        finish, tokens = None, None
        async for chunk in stream:
            finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
            tokens = chunk.usage.completion_tokens if chunk.usage else tokens
        return Outcome(completion_tokens=tokens, finish_reason=finish)
    except (openai.APIConnectionError, openai.APIStatusError):
        raise  # not a busy answer: a broken connection or an HTTP error status
    except openai.APIError as exc:
        # An error without a JSON object body shows up as an empty one, which the test rejects.
        return Outcome(busy_error=exc.body if isinstance(exc.body, Mapping) else {})


async def _watch_engine(
    http: aiohttp.ClientSession, stack: Stack, done: asyncio.Event
) -> list[tuple[float, float]]:
    """(running, waiting) as vLLM reports them, sampled until ``done`` is set."""
    seen: list[tuple[float, float]] = []
    while not done.is_set():
        text = await scrape.fetch_text(http, f"{stack.vllm_url}/metrics")
        seen.append(
            (
                scrape.total(text, "vllm:num_requests_running"),
                scrape.total(text, "vllm:num_requests_waiting"),
            )
        )
        await asyncio.sleep(POLL_S)
    return seen


async def _capacity(http: aiohttp.ClientSession, stack: Stack) -> dict[str, Any]:
    async with http.get(f"{stack.admin_url}/capacity") as response:
        body: dict[str, Any] = await response.json()
        return body


async def _run_burst(
    via_sidecar: openai.AsyncOpenAI, http: aiohttp.ClientSession, stack: Stack, size: int
) -> tuple[list[Outcome], list[tuple[float, float]]]:
    done = asyncio.Event()
    watcher = asyncio.create_task(_watch_engine(http, stack, done), name="watch-engine")
    try:
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(_one(via_sidecar, stack, i) for i in range(size))), timeout=120
        )
    finally:
        done.set()
        seen = await watcher
    return list(outcomes), seen


async def test_burst_is_held_at_the_permit_count(
    stack: Stack, via_sidecar: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    """vLLM never runs more than the permits, never queues, admitted finish, the rest are busy."""
    permits = (await _capacity(http, stack))["permits"]
    assert 1 <= permits < stack.max_num_seqs, "vLLM must be able to run more than the permits"
    outcomes, seen = await _run_burst(via_sidecar, http, stack, size=4 * permits)

    assert max(running for running, _ in seen) == permits
    assert max(waiting for _, waiting in seen) == 0
    completed = [o for o in outcomes if o.busy_error is None]
    busy = [o for o in outcomes if o.busy_error is not None]
    assert len(completed) >= permits
    assert all(o.finish_reason == "length" for o in completed)
    assert all(o.completion_tokens == GENERATED for o in completed)
    assert len(busy) >= 4 * permits - permits - stack.max_queue
    assert all({"message", "type", "code"} <= set(o.busy_error or {}) for o in busy)


async def test_burst_returns_every_permit(
    stack: Stack, via_sidecar: openai.AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    """After a burst the sidecar shows no permit in use and nobody queued."""
    permits = (await _capacity(http, stack))["permits"]
    await _run_burst(via_sidecar, http, stack, size=3 * permits)
    deadline = asyncio.get_running_loop().time() + 2.0
    capacity = await _capacity(http, stack)
    while (capacity["in_use"], capacity["queued"]) != (0, 0):
        assert asyncio.get_running_loop().time() < deadline, f"permits still held: {capacity}"
        await asyncio.sleep(POLL_S)
        capacity = await _capacity(http, stack)
    assert capacity["permits"] == permits
