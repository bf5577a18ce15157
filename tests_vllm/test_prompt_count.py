"""The sidecar's exact prompt count (SIDECAR_PROMPT_TOKENS=engine) agrees with vLLM's own usage."""

from __future__ import annotations

import json

import openai
import pytest
from conftest import Stack
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from sidecar.core.request.request_checks import TokenPolicy, check_request
from sidecar.edge.engine.pool import EnginePool
from sidecar.edge.proxy.prompt_count import EnginePromptCounter

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three prime numbers and nothing else."},
]


@pytest.mark.parametrize(
    ("payload", "request_kind"),
    [
        pytest.param({"messages": MESSAGES, "add_generation_prompt": True}, "chat", id="chat"),
        pytest.param({"prompt": "The capital of France is"}, "completions", id="completions"),
    ],
)
async def test_tokenize_count_equals_the_prompt_tokens_vllm_bills(
    stack: Stack, direct: openai.AsyncOpenAI, payload: dict[str, object], request_kind: str
) -> None:
    """What the sidecar asks /tokenize for is exactly the prompt_tokens vLLM reports in usage."""
    upstream = EnginePool(stack.vllm_url, connect_timeout_s=5, read_timeout_s=30)
    try:
        counted = await EnginePromptCounter(upstream).count(
            {"model": stack.served_model, **payload}, {}
        )
    finally:
        upstream.close()
    if request_kind == "chat":
        chat = await direct.chat.completions.create(
            model=stack.served_model, messages=MESSAGES, max_tokens=1
        )
        usage = chat.usage
    else:
        text = await direct.completions.create(
            model=stack.served_model, prompt="The capital of France is", max_tokens=1
        )
        usage = text.usage
    assert usage is not None
    assert counted == usage.prompt_tokens


TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


async def test_vllm_takes_what_the_sidecar_asks_it_to_render(
    stack: Stack, direct: openai.AsyncOpenAI
) -> None:
    """The /tokenize payload the request checks build for a chat with tools, documents and
    template inputs is one vLLM accepts, and counts as the completion bills it."""
    body = {
        "model": stack.served_model,
        "messages": MESSAGES,
        "tools": TOOLS,
        "documents": [{"title": "primes", "text": "2, 3, 5, 7"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "max_tokens": 1,
    }
    policy = TokenPolicy(max_prompt_tokens=256, max_completion_tokens=16, count_from_engine=True)
    payload = check_request(json.dumps(body).encode(), "chat", policy).tokenize
    assert payload is not None
    upstream = EnginePool(stack.vllm_url, connect_timeout_s=5, read_timeout_s=30)
    try:
        counted = await EnginePromptCounter(upstream).count(payload, {})
    finally:
        upstream.close()
    chat = await direct.chat.completions.create(
        model=stack.served_model,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="none",  # "auto" needs vLLM's tool-call parser flags; the render is the same
        max_tokens=1,
        extra_body={
            "documents": body["documents"],
            "chat_template_kwargs": {"enable_thinking": False},
        },
    )
    assert chat.usage is not None
    assert counted == chat.usage.prompt_tokens
