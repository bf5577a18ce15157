"""The prompt estimate prices what the engine renders: every field a chat template puts into the
prompt, each media part at its configured figure, never an image's base64 bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sidecar.core.errors import RequestError
from sidecar.core.request.prompt_estimate import (
    MESSAGE_OVERHEAD_TOKENS,
    PromptRates,
    estimate_prompt,
)

RATES = PromptRates(bytes_per_token=4.0, media_tokens=1600)
BIG = "x" * 100_000  # 100 KB of text: 25,000 tokens at 4 bytes a token
USER = {"role": "user", "content": "hi"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": BIG}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 1_000_000}}


def chat(**body: Any) -> int:
    return estimate_prompt(body, "chat", RATES)[0]


def responses(**body: Any) -> int:
    return estimate_prompt(body, "responses", RATES)[0]


@pytest.mark.parametrize(
    "tokens",
    [
        pytest.param(
            lambda: chat(
                messages=[USER],
                tools=[{"type": "function", "function": {"name": "f", "description": BIG}}],
            ),
            id="tools-description",
        ),
        pytest.param(
            lambda: chat(messages=[USER], functions=[{"name": "f", "description": BIG}]),
            id="legacy-functions",
        ),
        pytest.param(
            lambda: chat(messages=[USER, {"role": "assistant", "tool_calls": [CALL]}]),
            id="tool-call-arguments",
        ),
        pytest.param(
            lambda: chat(messages=[{"role": "user", "name": BIG, "content": "hi"}]),
            id="message-name",
        ),
        pytest.param(
            lambda: chat(messages=[{"role": "tool", "tool_call_id": "c", "content": BIG}]),
            id="tool-role-content",
        ),
        pytest.param(
            lambda: chat(messages=[USER], documents=[{"title": "t", "text": BIG}]),
            id="documents",
        ),
        pytest.param(
            lambda: chat(messages=[USER], chat_template_kwargs={"context": BIG}),
            id="template-inputs",
        ),
        pytest.param(
            lambda: chat(messages=[{"role": "assistant", "reasoning_content": BIG}]),
            id="reasoning-content",
        ),
        pytest.param(lambda: responses(input="hi", instructions=BIG), id="responses-instructions"),
        pytest.param(
            lambda: responses(
                input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": BIG}]
            ),
            id="responses-function-call",
        ),
        pytest.param(
            lambda: responses(
                input=[{"type": "function_call_output", "call_id": "c", "output": BIG}]
            ),
            id="responses-function-output",
        ),
        pytest.param(
            lambda: responses(
                input=[{"role": "user", "content": [{"type": "input_text", "text": BIG}]}]
            ),
            id="responses-input-text",
        ),
        pytest.param(
            lambda: responses(
                input="hi",
                tools=[{"type": "function", "name": "f", "description": BIG, "parameters": {}}],
            ),
            id="responses-tools",
        ),
        pytest.param(
            lambda: chat(messages=[{"role": "user", "content": [{"type": "x", "data": BIG}]}]),
            id="unknown-part-type",
        ),
        pytest.param(
            lambda: chat(messages=[{"role": "user", "content": [{"data": {"nested": [BIG]}}]}]),
            id="part-without-type-nested",
        ),
        pytest.param(
            lambda: chat(
                messages=[{"role": "assistant", "content": [{"type": "thinking", "thinking": BIG}]}]
            ),
            id="thinking-part",
        ),
    ],
)
def test_every_rendered_field_is_priced(tokens: Any) -> None:
    """100 KB in any field the template renders is priced as 100 KB (25,000 tokens), not 4-14."""
    assert tokens() >= 25_000


def test_an_unknown_part_holding_media_prices_the_media_not_its_bytes() -> None:
    """A part of an unknown type wrapping an image is priced as the image (and its strings)."""
    wrapped = {"type": "x-wrapper", "caption": "abcd", "items": [IMAGE]}
    tokens = chat(messages=[{"role": "user", "content": [wrapped]}])
    assert tokens == MESSAGE_OVERHEAD_TOKENS + 1 + 1600


def test_a_tools_schema_is_priced_as_its_json() -> None:
    """A tool's parameters schema is rendered as JSON: keys, punctuation and all."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(500)}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    rendered = len(json.dumps([tool]))
    assert chat(messages=[USER], tools=[tool]) == chat(messages=[USER]) + -(-rendered // 4)


@pytest.mark.parametrize(
    ("parts", "media"),
    [
        pytest.param([IMAGE], 1, id="one-image"),
        pytest.param([IMAGE, IMAGE, {"type": "text", "text": "and"}], 2, id="two-images"),
        pytest.param(
            [{"type": "input_audio", "input_audio": {"data": "A" * 500_000, "format": "wav"}}],
            1,
            id="audio",
        ),
        pytest.param([{"type": "video_url", "video_url": {"url": "http://v"}}], 1, id="video"),
    ],
)
def test_media_is_priced_per_part_not_by_its_bytes(parts: list[Any], media: int) -> None:
    """A 1 MB base64 image costs the configured figure, whatever its size."""
    tokens = chat(messages=[{"role": "user", "content": parts}])
    text = sum(len(p.get("text", "")) for p in parts)
    assert tokens == MESSAGE_OVERHEAD_TOKENS + -(-text // 4) + media * RATES.media_tokens


def test_a_responses_image_is_priced_per_part() -> None:
    """input_image in a Responses input item: the configured figure, not its base64 bytes."""
    part = {"type": "input_image", "image_url": "data:image/png;base64," + "A" * 1_000_000}
    tokens = responses(input=[{"role": "user", "content": [part]}])
    assert tokens == MESSAGE_OVERHEAD_TOKENS + RATES.media_tokens


def test_a_plain_chat_costs_what_it_did() -> None:
    """Role and content alone: the per-message overhead and the text, nothing more."""
    assert chat(messages=[{"role": "user", "content": "12345678"}]) == MESSAGE_OVERHEAD_TOKENS + 2


def test_a_deeply_nested_tool_call_costs_no_recursion() -> None:
    """The walk keeps its own stack: a body nested as deep as JSON allows is priced, not a 500."""
    deep: Any = "x"
    for _ in range(50_000):
        deep = [deep]
    call = {"type": "function", "function": {"name": "f", "arguments": deep}}
    assert chat(messages=[{"role": "assistant", "tool_calls": [call]}]) > 0


def test_deeply_nested_tools_are_a_400() -> None:
    """Tools nested past what JSON rendering can carry: refused, naming the field."""
    deep: Any = {}
    for _ in range(50_000):
        deep = {"a": deep}
    with pytest.raises(RequestError, match="'tools' is nested too deeply"):
        chat(messages=[USER], tools=[deep])
