"""Bodies an engine would choke on or misprice, over real sockets: refused with an OpenAI-shaped
4xx before admission, nothing reaching the engine, no permit held."""

from __future__ import annotations

import asyncio
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
            proxy_url(server) + path, data=body, headers={"Content-Type": "application/json"}
        ) as response,
    ):
        return response.status, await response.read()


async def in_use(server: SidecarServer) -> int:
    return int((await get_json(f"{admin_url(server)}/capacity"))["in_use"])


NUMBERS = [
    pytest.param(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
                 b'"temperature": NaN}', id="nan"),
    pytest.param(b'{"model": "m", "prompt": "hi", "temperature": Infinity}', id="infinity"),
    pytest.param(b'{"model": "m", "prompt": "hi", "top_p": -Infinity}', id="minus-infinity"),
    pytest.param(b'{"model": "m", "prompt": "hi", "temperature": 1e999}', id="overflow"),
    pytest.param(b'{"model": "m", "prompt": "hi", "logit_bias": {"5": -1e999}}', id="nested"),
]  # fmt: skip


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
