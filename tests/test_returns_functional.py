"""A caller back as a busy answer told it, over real sockets: known again by what it asks, it
waits in the queue up to the wait for returns (SIDECAR_RETURN_WAIT_MS), where a newcomer at the
same moment is held to its TTFT target. The sidecar's clock is the real one plus a shift the
test moves, so a caller "honours" a hint without the test sleeping through it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings
from tests.servers import BASE_ENV, admin_url, error_of, proxy_url, scrape, until

CHAT: dict[str, object] = {
    "model": "tiny-llama",
    "messages": [{"role": "user", "content": "hello there"}],
}
OTHER: dict[str, object] = {**CHAT, "messages": [{"role": "user", "content": "someone else"}]}
STALL = {"x-emulator-fault": "stall-after=1"}  # the engine stops after one token: a held permit
HURRIED = {"x-slo-ttft-ms": "50"}  # a newcomer may wait 50 ms of its target for a permit
ENV = {"SIDECAR_MAX_QUEUE": "4", "SIDECAR_CLAIMS_FROM": "127.0.0.1/32"}  # the TTFT header honoured


class ShiftedClock:
    """The monotonic clock, moved forward by hand: the caller's wait, spent at once."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return asyncio.get_running_loop().time() + self.shift


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def shifted(engine: str) -> AsyncIterator[tuple[SidecarServer, ShiftedClock]]:
    clock = ShiftedClock()
    server = SidecarServer(
        load_settings({**BASE_ENV, **ENV, "SIDECAR_UPSTREAM_URL": engine}), clock=clock
    )
    await server.start()
    try:
        yield server, clock
    finally:
        await server.stop()


async def _ask(
    session: aiohttp.ClientSession, server: SidecarServer, body: dict[str, object]
) -> tuple[int, str | None, int | None]:
    """One chat: its status, and where refused, its error code and retry-after-ms."""
    url = f"{proxy_url(server)}/v1/chat/completions"
    async with session.post(url, json={**body, "max_tokens": 4}, headers=HURRIED) as response:
        data = await response.read()
        if response.status == 200:
            return 200, None, None
        return response.status, error_of(data)["code"], int(response.headers["retry-after-ms"])


async def test_a_caller_back_as_told_waits_for_its_place_where_a_newcomer_is_refused(
    shifted: tuple[SidecarServer, ShiftedClock], session: aiohttp.ClientSession
) -> None:
    """Both permits held. A caller whose TTFT target leaves it 50 ms is refused and told when to
    come back. Back a second and more too early it is a newcomer again (refused at its 50 ms);
    back when told, it waits in the queue past the 50 ms a request arriving after it is refused
    at, and gets in when a permit frees. Counted in sidecar_returns_total."""
    server, clock = shifted
    url = f"{proxy_url(server)}/v1/chat/completions"
    held = []
    for _ in range(2):
        response = await session.post(url, json={**CHAT, "stream": True}, headers=STALL)
        await response.content.readuntil(b"\n\n")
        held.append(response)

    status, code, wait_ms = await _ask(session, server, CHAT)
    assert (status, code) == (429, "timeout")
    assert wait_ms is not None
    assert wait_ms >= 1000
    early = await _ask(session, server, CHAT)  # back at once: not as told, so not a return
    assert early[:2] == (429, "timeout")

    assert early[2] is not None
    clock.shift += early[2] / 1000  # the latest hint, honoured
    back = asyncio.create_task(_ask(session, server, CHAT))
    assert await until(lambda: _queued(server, 1))
    other = await _ask(session, server, OTHER)  # a newcomer, queued after the return
    assert other[:2] == (429, "timeout")
    assert await _queued(server, 1)  # the return still waits, past the newcomer's 50 ms
    held.pop().close()  # a permit frees while the return waits
    assert (await back)[0] == 200

    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_returns_total{result=admitted}"] == 1
    assert metrics["sidecar_returns_total{result=refused}"] == 0
    assert metrics["sidecar_requests_total{outcome=timeout}"] == 3
    for response in held:
        response.close()


async def _queued(server: SidecarServer, count: int) -> bool:
    return server.bulkhead.snapshot().queued == count
