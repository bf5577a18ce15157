"""The sidecar in front of the emulated engine speaking each engine's metrics (vLLM, SGLang,
llama.cpp), over real sockets, with SIDECAR_CAPACITY_SOURCE=auto and no model config: it tells
the engine by what it serves, plans from that engine's figures, and (llama.cpp) never runs more
than the slots, and a client's disconnect frees the slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.entry.app import SidecarServer
from sidecar.entry.probe_command import describe
from sidecar.entry.settings import load_settings
from tests.servers import BASE_ENV, admin_url, get_json, proxy_url, scrape, serve_app, until

# 100 + 28 = 128 tokens a request, alpha 1, no SIDECAR_MODEL: the engine's numbers only.
AUTO_ENV = {**BASE_ENV, "SIDECAR_CAPACITY_SOURCE": "auto", "SIDECAR_MODEL": ""}
Pair = tuple[SidecarServer, str]
StartPair = Callable[..., Awaitable[Pair]]


@pytest.fixture
async def start_pair() -> AsyncIterator[StartPair]:
    """An emulated engine of ``config`` and a sidecar in front of it; (sidecar, engine URL)."""
    runners: list[web.AppRunner] = []
    servers: list[SidecarServer] = []

    async def start(config: EmulatorConfig, **env: str) -> Pair:
        runner, url = await serve_app(build_app(config))
        runners.append(runner)
        server = SidecarServer(load_settings({**AUTO_ENV, "SIDECAR_UPSTREAM_URL": url, **env}))
        await server.start()
        servers.append(server)
        return server, url

    yield start
    for server in servers:
        await server.stop()
    for runner in runners:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("engine", "pool", "permits", "slots"),
    [
        pytest.param("vllm", 16_384, 128, None, id="vllm: cache_config_info"),
        pytest.param("sglang", 16_384, 128, None, id="sglang: max_total_num_tokens"),
        pytest.param("llamacpp", 4096, 4, 4, id="llamacpp: 4 slots of one shared 4,096"),
    ],
)
async def test_auto_names_the_engine_and_plans_from_its_figures(
    start_pair: StartPair, engine: str, pool: int, permits: int, slots: int | None
) -> None:
    """/capacity names the engine and its pool; llama.cpp's 32 fitting requests stop at -np 4."""
    config = EmulatorConfig(engine=engine, model_name="tiny", max_model_len=4096, max_num_seqs=4)
    server, _ = await start_pair(config)
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert (doc["engine"], doc["source"], doc["served_model"]) == (engine, engine, "tiny")
    assert (doc["kv_pool_tokens"], doc["permits"], doc["engine_slots"]) == (pool, permits, slots)
    assert doc["capacity"]["engine"]["max_model_len"] == 4096
    assert doc["warnings"] == []


async def test_sglang_bytes_per_token_come_from_its_pool_in_gib(start_pair: StartPair) -> None:
    """kv_cache_memory_usage_gb (GiB) / max_total_num_tokens = the emulator's 1,024 B/token."""
    server, _ = await start_pair(EmulatorConfig(engine="sglang", model_name="tiny"))
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert (doc["kv_bytes_per_token"], doc["kv_pool_bytes"]) == (1024, 16_384 * 1024)


async def test_llamacpp_split_slots_make_the_pool_np_times_a_slot(start_pair: StartPair) -> None:
    """SIDECAR_LLAMACPP_KV_UNIFIED=false (-np 4 without -kvu): 4 x 4,096 tokens, still 4 permits."""
    config = EmulatorConfig(engine="llamacpp", model_name="tiny", max_num_seqs=4)
    server, _ = await start_pair(config, SIDECAR_LLAMACPP_KV_UNIFIED="false")
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert (doc["kv_pool_tokens"], doc["permits"]) == (16_384, 4)


async def stream(session: aiohttp.ClientSession, url: str) -> int:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 20, "stream": True}
    async with session.post(f"{url}/v1/completions", json=body) as response:
        await response.read()
        return response.status


@pytest.mark.parametrize(
    "admission",
    [
        pytest.param("count", id="count: the slots cap the permits"),
        pytest.param("auto", id="auto: worst-case tokens would fit 32, the slots cap in flight"),
    ],
)
async def test_llamacpp_never_runs_more_than_the_sidecar_admits(
    start_pair: StartPair, admission: str
) -> None:
    """Eight streams at four slots: four run, four wait at the sidecar; none is deferred at the
    engine, and all eight complete, in every admission mode."""
    config = EmulatorConfig(engine="llamacpp", model_name="tiny", max_num_seqs=4, tokens_per_s=50)
    server, engine_url = await start_pair(
        config, SIDECAR_MAX_QUEUE="8", SIDECAR_MAX_WAIT_MS="10000", SIDECAR_ADMISSION=admission
    )
    seen: list[tuple[float, float]] = []

    async def watch() -> None:
        while True:
            metrics = await scrape(f"{engine_url}/metrics")
            seen.append(
                (metrics["llamacpp:requests_processing"], metrics["llamacpp:requests_deferred"])
            )
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    async with aiohttp.ClientSession() as session:
        statuses = await asyncio.gather(*(stream(session, proxy_url(server)) for _ in range(8)))
    watcher.cancel()
    assert statuses == [200] * 8
    assert max(running for running, _ in seen) == 4
    assert max(deferred for _, deferred in seen) == 0


async def busy_slots(engine_url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{engine_url}/slots") as response:
        return sum(bool(slot["is_processing"]) for slot in await response.json())


async def test_llamacpp_client_disconnect_frees_the_slot(start_pair: StartPair) -> None:
    """A client that goes away mid-stream: the engine's slot and the sidecar's permit are free."""
    config = EmulatorConfig(engine="llamacpp", model_name="tiny", max_num_seqs=4, tokens_per_s=5)
    server, engine_url = await start_pair(config)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 28, "stream": True}
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{proxy_url(server)}/v1/completions", json=body)
        await response.content.readany()
        assert await busy_slots(engine_url) == 1
        response.close()

    async def freed() -> bool:
        doc = await get_json(f"{admin_url(server)}/capacity")
        return await busy_slots(engine_url) == 0 and doc["in_use"] == 0

    assert await until(freed)


async def test_probe_names_the_engine(start_pair: StartPair) -> None:
    """``sidecar probe``'s summary says which engine answered and its slots."""
    config = EmulatorConfig(engine="llamacpp", model_name="tiny", max_num_seqs=4)
    server, _ = await start_pair(config)
    doc = await get_json(f"{admin_url(server)}/capacity")
    lines = describe(doc["capacity"])
    assert "engine: llamacpp (model=tiny, max_model_len=4096, slots=4, running=0" in "\n".join(
        lines
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp"])
async def test_a_pinned_source_reads_its_engine(start_pair: StartPair, engine: str) -> None:
    """SIDECAR_CAPACITY_SOURCE=<engine> plans from that engine, as auto does."""
    config = EmulatorConfig(engine=engine, model_name="tiny", max_model_len=4096, max_num_seqs=4)
    server, _ = await start_pair(config, SIDECAR_CAPACITY_SOURCE=engine)
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert (doc["engine"], doc["source"], doc["stale"]) == (engine, engine, False)


async def test_a_source_pinned_to_another_engine_plans_nothing(start_pair: StartPair) -> None:
    """SIDECAR_CAPACITY_SOURCE=vllm in front of SGLang: no vLLM pool is read, so the sidecar
    stays on its floor and says why, rather than planning from another engine's numbers."""
    server, _ = await start_pair(EmulatorConfig(engine="sglang"), SIDECAR_CAPACITY_SOURCE="vllm")
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert (doc["on_floor"], doc["capacity"]["error"]) == (
        True,
        "the engine reports no KV cache config",
    )


@pytest.mark.parametrize(
    ("engine", "warnings", "fallback"),
    [
        pytest.param("sglang", [], 0, id="sglang: retractions drive over-commit"),
        pytest.param("llamacpp", ["adaptive_unsupported"], 1, id="llamacpp: never preempts"),
    ],
)
async def test_adaptive_admission_reads_each_engines_preemptions(
    start_pair: StartPair, engine: str, warnings: list[str], fallback: int
) -> None:
    """SGLang's retraction counter is a preemption counter: adaptive admission over-commits on
    it; llama.cpp has none, so every request is priced at its worst case, and a warning says so."""
    config = EmulatorConfig(engine=engine, model_name="tiny", max_num_seqs=64)
    server, _ = await start_pair(
        config, SIDECAR_ADMISSION="adaptive", SIDECAR_ADAPTIVE_MIN_SAMPLES="1"
    )
    async with aiohttp.ClientSession() as session:
        assert await stream(session, proxy_url(server)) == 200
    doc = await get_json(f"{admin_url(server)}/capacity")
    assert [w["code"] for w in doc["warnings"]] == warnings
    metrics = await scrape(f"{admin_url(server)}/metrics")
    assert metrics["sidecar_adaptive_fallback"] == fallback
