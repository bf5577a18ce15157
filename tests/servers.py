"""Fixtures that run real servers on loopback sockets: the emulated engine and the sidecar."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings

TINY_MODEL = Path(__file__).parent / "configs" / "tiny-llama.json"
# The tiny model keeps 1,024 KV bytes per token; 100 + 28 tokens = 131,072 bytes per request.
BASE_ENV = {
    "SIDECAR_HOST": "127.0.0.1",
    "SIDECAR_ADMIN_HOST": "127.0.0.1",
    "SIDECAR_PORT": "0",
    "SIDECAR_ADMIN_PORT": "0",
    "SIDECAR_CAPACITY_SOURCE": "static",
    "SIDECAR_ADMISSION": "count",  # the permit arithmetic these tests count on; auto: own tests
    "SIDECAR_MODEL": str(TINY_MODEL),
    "SIDECAR_KV_POOL": str(2 * 131_072),
    "SIDECAR_SAFETY_FACTOR": "1",
    "SIDECAR_MAX_PROMPT_TOKENS": "100",
    "SIDECAR_MAX_COMPLETION_TOKENS": "28",
    "SIDECAR_MAX_QUEUE": "0",
    "SIDECAR_MAX_WAIT_MS": "3000",
    "SIDECAR_REFRESH_MS": "60000",
}

StartSidecar = Callable[..., Awaitable[SidecarServer]]


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """Run ``app`` on a free loopback port; the runner (to clean up) and its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@contextlib.contextmanager
def sidecar_in_a_thread(
    engine: Callable[[], web.Application], env: dict[str, str], loop: asyncio.AbstractEventLoop
) -> Iterator[SidecarServer]:
    """A sidecar with BASE_ENV plus ``env`` in front of ``engine()``, both on ``loop``, run in a
    background thread, for tests that talk to it with blocking sockets; stopped after."""
    thread = threading.Thread(target=loop.run_forever, name="sidecar-loop", daemon=True)
    thread.start()

    async def start() -> tuple[SidecarServer, web.AppRunner]:
        runner, url = await serve_app(engine())
        server = SidecarServer(load_settings({**BASE_ENV, **env, "SIDECAR_UPSTREAM_URL": url}))
        await server.start()
        return server, runner

    server, runner = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield server
    finally:

        async def stop() -> None:
            await server.stop()
            await runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


@contextlib.asynccontextmanager
async def connected(
    port: int, timeout_s: float = 5.0
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A raw client connection to ``port``; everything inside is bounded by ``timeout_s``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(timeout_s):
            yield reader, writer
    finally:
        writer.close()


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port where every connect is refused until a server listens there, held for the
    block: bound, never listening, so no ``bind(0)`` (a sidecar's own ports, another test worker's
    server) is given it meanwhile; a server binding it with SO_REUSEADDR (aiohttp's default) may."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


@pytest.fixture
def held_port() -> Iterator[Callable[[], int]]:
    """Hands out refused_port()s held until the test ends: for servers started in a subprocess,
    which bind them with SO_REUSEADDR (socket.create_server, aiohttp and Go all set it)."""
    with contextlib.ExitStack() as held:
        yield lambda: held.enter_context(refused_port())


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    """The emulated engine, generating as fast as it can, on a free port."""
    runner, url = await serve_app(build_app(EmulatorConfig(model_name="tiny-llama")))
    yield url
    await runner.cleanup()


@contextlib.asynccontextmanager
async def sidecars(upstream_url: str) -> AsyncIterator[StartSidecar]:
    """Start sidecars in front of ``upstream_url`` with BASE_ENV plus overrides; stop them after."""
    started: list[SidecarServer] = []

    async def start(**overrides: str) -> SidecarServer:
        env = {**BASE_ENV, "SIDECAR_UPSTREAM_URL": upstream_url, **overrides}
        server = SidecarServer(load_settings(env))
        await server.start()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            await server.stop()


@pytest.fixture
async def start_sidecar(engine: str) -> AsyncIterator[StartSidecar]:
    """Start a sidecar in front of ``engine`` with BASE_ENV plus the given overrides."""
    async with sidecars(engine) as start:
        yield start


OpenAIFactory = Callable[..., openai.AsyncOpenAI]


@pytest.fixture
async def openai_client() -> AsyncIterator[OpenAIFactory]:
    """The official async SDK pointed at a base URL; every client is closed at teardown."""
    clients: list[openai.AsyncOpenAI] = []

    def make(base: str, **kwargs: Any) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(
            base_url=f"{base}/v1", api_key="sk-test-secret", **{"max_retries": 0, **kwargs}
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def proxy_url(server: SidecarServer) -> str:
    return f"http://127.0.0.1:{server.proxy_port}"


def admin_url(server: SidecarServer) -> str:
    return f"http://127.0.0.1:{server.admin_port}"


async def get_json(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        data: dict[str, Any] = await response.json()
        return data


async def scrape(url: str) -> dict[str, float]:
    """Every sample of a /metrics page, keyed ``name{label=value}``, read by prometheus_client."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> bool:
    """Poll a condition another process or socket must bring about; bounded in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.02)
    return await check()


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(event, data) pairs of an SSE body, for asserting on the exact wire format."""
    events = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append((fields.get("event"), fields.get("data", "")))
    return events


def error_of(body: bytes) -> dict[str, Any]:
    data = json.loads(body)
    assert set(data["error"]) == {"message", "type", "param", "code"}, data
    error: dict[str, Any] = data["error"]
    return error
