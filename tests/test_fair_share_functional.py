"""Issue 48 rows 2-3 over real sockets: a source that holds every place and queues more for
answers it never reads does not keep another source waiting behind it. The next place that
frees is the other source's, whether sources are told apart by tenant or by client address."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from sidecar.entry.app import SidecarServer
from tests.servers import StartSidecar, proxy_url, until

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello there"}]}
STALL = {"x-emulator-fault": "stall-after=1"}  # the engine stops after one token: a held place
LIGHT_ADDRESS = "127.0.0.2"  # another client address on the loopback network


async def stream(
    session: aiohttp.ClientSession, server: SidecarServer, tenant: str | None
) -> aiohttp.ClientResponse:
    """A stream the engine stalls after its first event, once it got a place: it keeps it."""
    headers = STALL if tenant is None else {**STALL, "x-tenant-id": tenant}
    response = await session.post(
        f"{proxy_url(server)}/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers
    )
    assert response.status == 200
    await response.content.readuntil(b"\n\n")
    return response


async def queued(server: SidecarServer, waiting: int) -> bool:
    return server.bulkhead.snapshot().queued == waiting


@contextlib.asynccontextmanager
async def sessions(by: str) -> AsyncIterator[tuple[aiohttp.ClientSession, aiohttp.ClientSession]]:
    """The heavy source's session and the light one's: on another address where sources are
    told apart by address, else the same loopback address (told apart by tenant)."""
    local = (LIGHT_ADDRESS, 0) if by == "address" else None
    async with (
        aiohttp.ClientSession() as heavy,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=local)) as light,
    ):
        yield heavy, light


@pytest.mark.parametrize(
    "by", [pytest.param("tenant", id="by-tenant"), pytest.param("address", id="by-address")]
)
async def test_a_freed_place_goes_to_the_source_holding_none(
    start_sidecar: StartSidecar, by: str
) -> None:
    """Two places, both held by one source's streams and three more of its streams queued; a
    stream of another source queued last (an unnamed tenant, or another address: the same
    default compartment) gets the next place that frees, and the heavy source's three still
    wait."""
    server = await start_sidecar(SIDECAR_MAX_QUEUE="8", SIDECAR_CLAIMS_FROM="127.0.0.1/32")
    tenants = ("heavy", "light") if by == "tenant" else (None, None)
    async with sessions(by) as (heavy, light):
        held = [await stream(heavy, server, tenants[0]) for _ in range(2)]
        waiting = [asyncio.create_task(stream(heavy, server, tenants[0])) for _ in range(3)]
        assert await until(lambda: queued(server, 3))
        other = asyncio.create_task(stream(light, server, tenants[1]))
        assert await until(lambda: queued(server, 4))
        held[0].close()  # one place freed
        async with asyncio.timeout(2):
            response = await other
        snapshot = server.bulkhead.snapshot()
        assert (snapshot.in_use, snapshot.queued) == (2, 3)
        assert not any(task.done() for task in waiting)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        response.close()
        held[1].close()
