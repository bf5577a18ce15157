"""The official openai SDK streams through the sidecar exactly what vLLM streams directly."""

from __future__ import annotations

import json
from dataclasses import dataclass

import aiohttp
import openai
import pytest
from conftest import Stack

MAX_TOKENS = 24
# temperature 0 makes the random-weight model deterministic; ignore_eos makes every stream run
# to max_tokens, so the comparison covers the same number of tokens every time.
SEED = 7
NO_EOS = {"ignore_eos": True}
MESSAGE = "Say something about the tide and the harbour."
PROMPT = "The lighthouse keeper wrote in the log that"


@dataclass(frozen=True)
class Streamed:
    """What a client reassembles from a stream: the text, the tokens counted, how it ended."""

    text: str
    completion_tokens: int | None
    finish_reason: str | None


async def _chat(client: openai.AsyncOpenAI, model: str) -> Streamed:
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": MESSAGE}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=MAX_TOKENS,
        temperature=0,
        seed=SEED,
        extra_body=NO_EOS,
    )
    pieces: list[str] = []
    finish, tokens = None, None
    async for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
    return Streamed("".join(pieces), tokens, finish)


async def _completion(client: openai.AsyncOpenAI, model: str) -> Streamed:
    stream = await client.completions.create(
        model=model,
        prompt=PROMPT,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=MAX_TOKENS,
        temperature=0,
        seed=SEED,
        extra_body=NO_EOS,
    )
    pieces: list[str] = []
    finish, tokens = None, None
    async for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish = choice.finish_reason or finish
        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
    return Streamed("".join(pieces), tokens, finish)


@pytest.mark.parametrize(
    "collect",
    [
        pytest.param(_chat, id="chat-completions"),
        pytest.param(_completion, id="completions"),
    ],
)
async def test_stream_through_sidecar_matches_vllm(
    stack: Stack, via_sidecar: openai.AsyncOpenAI, direct: openai.AsyncOpenAI, collect: object
) -> None:
    """Through the sidecar the SDK receives the same text and token count as from vLLM itself.

    Chunk boundaries are not compared: vLLM merges deltas when its reader lags, direct or not.
    """
    assert callable(collect)
    expected = await collect(direct, stack.served_model)
    got = await collect(via_sidecar, stack.served_model)
    assert expected == Streamed(expected.text, MAX_TOKENS, "length")
    assert len(expected.text) >= MAX_TOKENS // 2, "vLLM itself produced too little text to compare"
    assert got == expected


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": MESSAGE}]},
            id="chat-completions",
        ),
        pytest.param("/v1/completions", {"prompt": PROMPT}, id="completions"),
    ],
)
async def test_stream_through_sidecar_ends_with_done(
    stack: Stack, http: aiohttp.ClientSession, path: str, body: dict[str, object]
) -> None:
    """The raw SSE body relayed by the sidecar is well-formed and ends with `data: [DONE]`."""
    payload = {
        "model": stack.served_model,
        "stream": True,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        **body,
    }
    async with http.post(f"{stack.sidecar_url}{path}", json=payload) as response:
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        text = (await response.read()).decode()
    data = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    events = [json.loads(item) for item in data[:-1]]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert all("error" not in event for event in events)
