"""Issue 48 row 6: with SIDECAR_PROMPT_TOKENS=engine the engine's tokenizer is never a gate: a
prompt the estimate already puts far over the budget is refused without a /tokenize call, a late
count falls back to the estimate at its own deadline, and one client address has only its share
of counts in flight. Over real sockets, against a fake engine whose /tokenize answers in vLLM's
shape (``count``, ``max_model_len``, ``tokens``, ``token_strs``) as slowly as a test asks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from aiohttp import web

from sidecar.core.errors import RequestError
from sidecar.core.request.request_checks import TokenPolicy
from sidecar.edge.proxy.intake import checked_request
from sidecar.edge.proxy.prompt_count import EnginePromptCounter
from sidecar.entry.app import SidecarServer
from tests.servers import StartSidecar, serve_app, sidecars, until

BUDGET = 100  # BASE_ENV's SIDECAR_MAX_PROMPT_TOKENS


@dataclass
class Tokenizer:
    """The fake engine: /tokenize calls seen, and what holds them."""

    url: str = ""
    calls: list[str] = field(default_factory=list)  # each call's prompt
    count: int = 90
    released: asyncio.Event = field(default_factory=asyncio.Event)


def _engine(tokenizer: Tokenizer) -> web.Application:
    async def tokenize(request: web.Request) -> web.Response:
        payload = await request.json()
        tokenizer.calls.append(str(payload.get("prompt", "")))
        await tokenizer.released.wait()
        count = tokenizer.count
        return web.json_response(
            {
                "count": count,
                "max_model_len": 1024,
                "tokens": list(range(count)),
                "token_strs": None,
            }
        )

    async def completions(_request: web.Request) -> web.Response:
        body = {"object": "text_completion", "choices": [{"text": "hi"}]}
        return web.json_response(body)

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions", completions)
    return app


@pytest.fixture
async def tokenizer() -> AsyncIterator[Tokenizer]:
    fake = Tokenizer()
    runner, fake.url = await serve_app(_engine(fake))
    yield fake
    fake.released.set()
    await runner.cleanup()


@pytest.fixture
async def start(tokenizer: Tokenizer) -> AsyncIterator[StartSidecar]:
    async with sidecars(tokenizer.url) as starting:

        async def start(**overrides: str) -> SidecarServer:
            return await starting(
                SIDECAR_PROMPT_TOKENS="engine", SIDECAR_KV_POOL=str(16 * 131_072), **overrides
            )

        yield start


async def complete(server: SidecarServer, prompt: str, address: str = "127.0.0.1") -> int:
    """A completion from ``address``: the status it got (0: none within 5 s)."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 4}).encode()
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.proxy_port, local_addr=(address, 0)
    )
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    try:
        async with asyncio.timeout(5):
            status_line = await reader.readline()
            await reader.read()
    except TimeoutError:
        return 0
    finally:
        writer.close()
    return int(status_line.split()[1])


async def test_a_prompt_far_over_the_budget_is_refused_without_a_count(
    start: StartSidecar, tokenizer: Tokenizer
) -> None:
    """An estimate past four times the budget is a 400 with no /tokenize call; one over the
    budget by less is counted, and the engine's count (under it) decides: served."""
    tokenizer.released.set()
    server = await start()
    far, near = "a " * (4 * BUDGET * 3), "a " * (BUDGET * 3)  # about 600 and 150 tokens
    assert await complete(server, far) == 400
    assert tokenizer.calls == []
    assert await complete(server, near) == 200
    assert tokenizer.calls == [near]


async def test_a_late_count_falls_back_to_the_estimate(
    start: StartSidecar, tokenizer: Tokenizer
) -> None:
    """A /tokenize that does not answer: at SIDECAR_TOKENIZE_TIMEOUT_MS the request is priced by
    its estimate and served; its gate slot is back."""
    server = await start(SIDECAR_TOKENIZE_TIMEOUT_MS="200")
    assert await complete(server, "hi") == 200
    assert len(tokenizer.calls) == 1
    assert server.gate.held == 0


async def test_one_address_has_its_share_of_counts_and_no_more(
    start: StartSidecar, tokenizer: Tokenizer
) -> None:
    """/tokenize held: of four completions from one address, two wait for their counts and two
    are served on the estimate at once; another address still gets its own count. Released,
    every one is served."""
    server = await start(SIDECAR_TOKENIZE_PER_CLIENT="2", SIDECAR_TOKENIZE_TIMEOUT_MS="5000")
    flood = [asyncio.create_task(complete(server, f"p{i}", "127.0.0.2")) for i in range(4)]
    done, waiting = await asyncio.wait(flood, timeout=3, return_when=asyncio.FIRST_COMPLETED)
    while len(done) < 2:
        more, waiting = await asyncio.wait(waiting, timeout=3, return_when=asyncio.FIRST_COMPLETED)
        done |= more
    other = asyncio.create_task(complete(server, "other", "127.0.0.3"))

    async def asked() -> bool:
        return "other" in tokenizer.calls

    assert await until(asked)
    assert [task.result() for task in done] == [200, 200]
    assert len(waiting) == 2
    assert len(tokenizer.calls) == 3
    assert "other" in tokenizer.calls
    tokenizer.released.set()
    assert [await task for task in (*waiting, other)] == [200, 200, 200]


class Counting:
    """A prompt counter that only counts its calls."""

    calls = 0

    async def count(
        self, _payload: dict[str, Any], _headers: Mapping[str, str], _client: str = ""
    ) -> int:
        self.calls += 1
        return 5


async def test_a_prompt_priced_at_the_engines_context_is_judged_by_its_whole_estimate() -> None:
    """Priced at the engine's context (300 tokens: under four times the 100-token budget), a
    prompt of about 6,000 tokens is still refused on its whole estimate, without a count."""
    budget = TokenPolicy(
        max_prompt_tokens=BUDGET,
        max_completion_tokens=28,
        count_from_engine=True,
        context_tokens=300,
    )
    body = json.dumps({"model": "m", "prompt": "a" * 24_000}).encode()
    counter = Counting()
    with pytest.raises(RequestError, match="about 6000 tokens"):
        await checked_request(
            body, "completions", budget, counter=cast(EnginePromptCounter, counter), headers={}
        )
    assert counter.calls == 0
