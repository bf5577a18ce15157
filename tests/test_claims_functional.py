"""Claims over real sockets: a tenant, an objective or a queue TTL is honoured only from the peer
the operator trusts (SIDECAR_CLAIMS_FROM), an API key's tenant wins over any header, and a client's
X-Request-Id reaches the engine, the logs and the answer only when it is a bounded token."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest
from structlog.testing import capture_logs

from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import (
    StartSidecar,
    admin_url,
    error_of,
    get_json,
    proxy_url,
    sidecars,
    until,
)

__all__ = ["double"]

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello there"}]}
STALL = {"x-emulator-fault": "stall-after=1"}  # the engine stops after one token: a held permit
KEY = "sk-tenant-capped-at-one"
KEYED = "key-" + hashlib.sha256(KEY.encode()).hexdigest()[:12]
FOUR_PERMITS = str(4 * 131_072)
MINTED = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def hold(
    session: aiohttp.ClientSession, server: SidecarServer, headers: dict[str, str]
) -> aiohttp.ClientResponse:
    """A stream the engine stalls after its first event: its permit stays held."""
    response = await session.post(
        f"{proxy_url(server)}/v1/chat/completions",
        json={**CHAT, "stream": True},
        headers={**STALL, **headers},
    )
    assert response.status == 200
    await response.content.readuntil(b"\n\n")
    return response


async def in_use(server: SidecarServer) -> dict[str, int]:
    doc = await get_json(f"{admin_url(server)}/capacity")
    return {part["name"]: part["in_use"] for part in doc["compartments"]}


async def test_an_untrusted_peers_tenant_claim_is_ignored(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession
) -> None:
    """By default nobody is trusted: 'x-tenant-id: gold' (and llm-d's fairness id) from a client
    runs in default, never in gold's reserve."""
    server = await start_sidecar(SIDECAR_COMPARTMENTS="gold=50%", SIDECAR_KV_POOL=FOUR_PERMITS)
    claiming = {"x-tenant-id": "gold", "x-llm-d-inference-fairness-id": "gold"}
    held = await hold(session, server, claiming)
    assert await in_use(server) == {"gold": 0, "default": 1}
    held.close()


async def test_an_api_key_wins_over_a_claimed_tenant(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession
) -> None:
    """A key capped at 1 of 4 permits that claims gold, even through the trusted gateway, stays
    in its own compartment: refused there, gold's permits untouched."""
    server = await start_sidecar(
        SIDECAR_COMPARTMENTS=f"{KEYED}=25%:25%,gold=50%",
        SIDECAR_KV_POOL=FOUR_PERMITS,
        SIDECAR_CLAIMS_FROM="127.0.0.1",
    )
    keyed = {"authorization": f"Bearer {KEY}"}
    held = await hold(session, server, keyed)
    url = f"{proxy_url(server)}/v1/chat/completions"
    spoofed = {**keyed, "x-tenant-id": "gold"}
    async with session.post(url, json={**CHAT, "max_tokens": 4}, headers=spoofed) as refused:
        assert refused.status == 429
        assert error_of(await refused.read())["code"] == "queue_full"
    assert await in_use(server) == {KEYED: 1, "gold": 0, "default": 0}
    held.close()


async def test_an_untrusted_priority_claim_takes_no_reserve(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession
) -> None:
    """Compartments by priority: 'x-priority: chat' from an untrusted client runs in default."""
    server = await start_sidecar(
        SIDECAR_COMPARTMENTS="chat=50%",
        SIDECAR_COMPARTMENT_BY="priority",
        SIDECAR_KV_POOL=FOUR_PERMITS,
        SIDECAR_CLAIMS_FROM="10.0.0.0/8",  # the gateway is elsewhere: loopback is a client
    )
    held = await hold(
        session, server, {"x-priority": "chat", "x-llm-d-inference-objective": "chat"}
    )
    assert await in_use(server) == {"chat": 0, "default": 1}
    held.close()


@pytest.mark.parametrize(
    "claim",
    [
        pytest.param({"x-llm-d-inference-ttl": "50ms"}, id="ttl"),
        pytest.param(
            {"x-llm-d-slo-ttft-ms": "50", "x-slo-ttft-ms": "60000"}, id="ttft-current-name"
        ),
    ],
)
async def test_a_trusted_ttl_caps_the_queue_wait(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession, claim: dict[str, str]
) -> None:
    """llm-d's per-request queue TTL (a Go duration) or TTFT target, from the gateway: told
    'timeout' (rejected-ttl-expired) long before the queue's own 3 s."""
    server = await start_sidecar(SIDECAR_MAX_QUEUE="4", SIDECAR_CLAIMS_FROM="127.0.0.0/8")
    held = [await hold(session, server, {}) for _ in range(2)]
    url = f"{proxy_url(server)}/v1/chat/completions"
    async with asyncio.timeout(2):  # the bulkhead's own limit is 3 s: this must end first
        async with session.post(url, json={**CHAT, "max_tokens": 4}, headers=claim) as response:
            assert response.status == 429
            assert response.headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
            assert error_of(await response.read())["code"] == "timeout"
    for response in held:
        response.close()


async def test_an_untrusted_ttl_does_not_cut_the_wait(
    start_sidecar: StartSidecar, session: aiohttp.ClientSession
) -> None:
    """The same TTL from a client the operator did not name waits in the queue and is served."""
    server = await start_sidecar(SIDECAR_MAX_QUEUE="4")
    held = [await hold(session, server, {}) for _ in range(2)]
    url = f"{proxy_url(server)}/v1/chat/completions"
    waiting = asyncio.ensure_future(
        session.post(url, json={**CHAT, "max_tokens": 4}, headers={"x-llm-d-inference-ttl": "1ns"})
    )

    async def queued() -> bool:
        return server.bulkhead.snapshot().queued == 1

    assert await until(queued)
    held[0].close()
    response = await asyncio.wait_for(waiting, 5)
    assert response.status == 200
    response.close()
    held[1].close()


async def raw_exchange(port: int, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        async with asyncio.timeout(5):
            return await reader.read(65536)
    finally:
        writer.close()


@pytest.mark.parametrize(
    "given",
    [
        pytest.param(b"\xff" * 8000, id="8000-bytes-of-0xff"),
        pytest.param(b"a" * 129, id="129-characters"),
        pytest.param(b"two words", id="a-space"),
    ],
)
async def test_a_hostile_request_id_is_replaced(double: EngineDouble, given: bytes) -> None:
    """Neither forwarded, nor echoed, nor logged: the sidecar mints its own id and uses it
    everywhere."""
    async with sidecars(double.url) as start:
        server = await start()
        head = (
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Request-Id: "
            + given
            + b"\r\n\r\n"
        )
        with capture_logs() as logs:
            answer = await raw_exchange(server.proxy_port, head)
    assert answer.startswith(b"HTTP/1.1 200")
    assert given not in answer
    echoed = re.search(rb"\r\nX-Request-Id: ([^\r]*)\r\n", answer, re.IGNORECASE)
    assert echoed is not None
    assert MINTED.fullmatch(echoed[1].decode())
    assert double.request_ids == [echoed[1].decode()]
    assert all(len(str(line.get("request_id", ""))) <= 32 for line in logs)


async def test_a_well_formed_request_id_is_kept(double: EngineDouble) -> None:
    """A client's bounded id is the engine's, the logs' and the answer's."""
    async with sidecars(double.url) as start, aiohttp.ClientSession() as session:
        server = await start()
        given = "0f8fad5b-d9cb-469f-a165-70867728950e"
        async with session.get(
            f"{proxy_url(server)}/v1/models", headers={"X-Request-Id": given}
        ) as response:
            assert response.headers["X-Request-Id"] == given
    assert double.request_ids == [given]
