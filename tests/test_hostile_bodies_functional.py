"""Bodies an engine would choke on or misprice, over real sockets: refused with an OpenAI-shaped
4xx before admission, nothing reaching the engine, no permit held."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import admin_url, error_of, get_json, proxy_url, sidecars

__all__ = ["double"]

Start = Callable[..., Awaitable[SidecarServer]]


@pytest.fixture
async def edge(double: EngineDouble) -> AsyncIterator[Start]:
    async with sidecars(double.url) as start:
        yield start


async def post(server: SidecarServer, path: str, body: bytes) -> tuple[int, bytes]:
    async with (
        asyncio.timeout(5),
        aiohttp.ClientSession() as session,
        session.post(
            proxy_url(server) + path,
            data=io.BytesIO(body),
            headers={"Content-Type": "application/json"},
        ) as response,
    ):
        return response.status, await response.read()


async def in_use(server: SidecarServer) -> int:
    return int((await get_json(f"{admin_url(server)}/capacity"))["in_use"])


NUMBERS = [
    pytest.param(
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        id="nan",
    ),
    pytest.param(b'{"model": "m", "prompt": "hi", "temperature": Infinity}', id="infinity"),
    pytest.param(b'{"model": "m", "prompt": "hi", "top_p": -Infinity}', id="minus-infinity"),
    pytest.param(b'{"model": "m", "prompt": "hi", "temperature": 1e999}', id="overflow"),
    pytest.param(b'{"model": "m", "prompt": "hi", "logit_bias": {"5": -1e999}}', id="nested"),
]


@pytest.mark.parametrize("body", NUMBERS)
async def test_a_number_json_has_not_is_a_400_before_the_engine(
    edge: Start, double: EngineDouble, body: bytes
) -> None:
    """NaN, Infinity and 1e999 (an infinity once parsed): 400 invalid_json, the engine untouched."""
    server = await edge()
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    status, answer = await post(server, path, body)
    assert status == 400
    assert error_of(answer)["code"] == "invalid_json"
    assert double.generating() == 0
    assert await in_use(server) == 0


BIG = "x" * 100_000  # ~25,000 tokens as the engine renders it
# A 3,000-token prompt budget, and KV for two such requests (the tiny model: 1 KiB a token).
BUDGET_3000 = {"SIDECAR_MAX_PROMPT_TOKENS": "3000", "SIDECAR_KV_POOL": str(2 * 3028 * 1024)}
USER = {"role": "user", "content": "hi"}
RENDERS = [
    pytest.param(
        "/v1/chat/completions",
        {
            "messages": [USER],
            "tools": [{"type": "function", "function": {"name": "f", "description": BIG}}],
        },
        id="tools",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "messages": [
                USER,
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": BIG}}
                    ],
                },
            ]
        },
        id="tool-call-arguments",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "name": BIG, "content": "hi"}]},
        id="name",
    ),
    pytest.param(
        "/v1/chat/completions", {"messages": [USER], "documents": [{"text": BIG}]}, id="documents"
    ),
    pytest.param(
        "/v1/chat/completions",
        {"messages": [{"role": "tool", "tool_call_id": "c", "content": BIG}]},
        id="tool-role",
    ),
    pytest.param(
        "/v1/responses",
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": BIG}]},
        id="responses-function-call",
    ),
    pytest.param(
        "/v1/responses", {"input": "hi", "instructions": BIG}, id="responses-instructions"
    ),
    pytest.param(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "x-unknown", "payload": BIG}]}]},
        id="unknown-part-type",
    ),
    pytest.param(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"payload": BIG}]}]},
        id="part-without-type",
    ),
    pytest.param(
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "assistant", "content": [{"type": "thinking", "thinking": BIG}]},
                USER,
            ]
        },
        id="thinking-part",
    ),
]


@pytest.mark.parametrize(("path", "body"), RENDERS)
async def test_a_render_over_the_prompt_budget_is_refused(
    edge: Start, double: EngineDouble, path: str, body: dict[str, object]
) -> None:
    """100 KB in any field the template renders, on a 3,000-token prompt budget: 400
    prompt_over_budget (it was admitted, priced at 4-14 tokens), the engine untouched."""
    server = await edge(**BUDGET_3000)
    status, answer = await post(server, path, json.dumps({"model": "m", **body}).encode())
    assert status == 400
    assert error_of(answer)["code"] == "prompt_over_budget"
    assert double.generating() == 0
    assert await in_use(server) == 0


UNPRICED = [
    pytest.param(
        "/v1/chat/completions",
        {"messages": [USER], "chat_template": BIG},
        "estimate",
        id="chat-template",
    ),
    pytest.param(
        "/v1/responses",
        {"input": "hi", "chat_template": BIG},
        "estimate",
        id="responses-chat-template",
    ),
    pytest.param(
        "/v1/responses",
        {"input": "hi", "chat_template": BIG},
        "engine",
        id="responses-chat-template-engine-count",
    ),
    pytest.param(
        "/v1/completions", {"prompt": "hi", "prompt_embeds": BIG}, "estimate", id="prompt-embeds"
    ),
    pytest.param("/v1/completions", {"prompt_embeds": BIG}, "estimate", id="prompt-embeds-alone"),
    pytest.param(
        "/v1/completions",
        {"prompt": "hi", "prompt_embeds": BIG},
        "engine",
        id="prompt-embeds-engine-count",
    ),
]


@pytest.mark.parametrize(("path", "body", "count"), UNPRICED)
async def test_what_cannot_be_priced_is_refused_by_name(
    edge: Start, double: EngineDouble, path: str, body: dict[str, object], count: str
) -> None:
    """A request's own chat template (a loop renders any length) with no engine count of it,
    and prompt embeddings (only the engine reads their length): 400 unsupported_parameter
    naming the field, OpenAI-shaped, the engine untouched."""
    server = await edge(**BUDGET_3000, SIDECAR_PROMPT_TOKENS=count)
    status, answer = await post(server, path, json.dumps({"model": "m", **body}).encode())
    assert status == 400
    error = error_of(answer)
    param = "prompt_embeds" if "prompt_embeds" in body else "chat_template"
    assert (error["code"], error["param"]) == ("unsupported_parameter", param)
    assert error["type"] == "invalid_request_error"
    assert double.generating() == 0
    assert await in_use(server) == 0


async def test_a_chat_template_the_engine_counts_is_priced_by_its_count(
    edge: Start, double: EngineDouble
) -> None:
    """SIDECAR_PROMPT_TOKENS=engine: a request's own template goes to /tokenize with the
    messages, and the request is priced (and served) by the engine's count."""
    server = await edge(**BUDGET_3000, SIDECAR_PROMPT_TOKENS="engine")
    body = {"model": "m", "messages": [USER], "chat_template": "{{ messages }}"}
    status, _ = await post(server, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 200
    assert [path for _, path in double.seen] == ["/tokenize", "/v1/chat/completions"]


def image_chat(images: int) -> bytes:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 1_000_000}}
    content = [{"type": "text", "text": "what is this?"}, *[image] * images]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()


@pytest.mark.parametrize(("images", "status"), [(1, 200), (2, 400)], ids=["one", "two"])
async def test_images_are_priced_per_image_not_by_their_bytes(
    edge: Start, double: EngineDouble, images: int, status: int
) -> None:
    """1 MB of base64 is one image (1,600 tokens): it fits a 3,000-token budget; two do not."""
    server = await edge(**BUDGET_3000, SIDECAR_MEDIA_PROMPT_TOKENS="1600")
    got, answer = await post(server, "/v1/chat/completions", image_chat(images))
    assert got == status
    assert double.generating() == (1 if status == 200 else 0)
    if status == 400:
        assert error_of(answer)["code"] == "prompt_over_budget"


async def test_with_the_engine_counting_what_it_cannot_count_is_still_bounded(
    edge: Start, double: EngineDouble
) -> None:
    """SIDECAR_PROMPT_TOKENS=engine: a Responses input (which /tokenize cannot take) is bounded
    by its estimate, not let through unpriced."""
    server = await edge(**BUDGET_3000, SIDECAR_PROMPT_TOKENS="engine")
    body = json.dumps({"model": "m", "input": "hi", "instructions": BIG}).encode()
    status, answer = await post(server, "/v1/responses", body)
    assert status == 400
    assert error_of(answer)["code"] == "prompt_over_budget"
    assert double.seen == []
