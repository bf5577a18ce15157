"""The engine probe over real sockets tells vLLM, SGLang and llama.cpp apart by what they serve,
with no setting, and reads each in its own dialect (doubles per tests/test_engine_dialects.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sidecar.core.errors import ProbeTemporaryError
from sidecar.live.probes.engine_probe import EngineMetricsProbe

FIXTURES = Path(__file__).resolve().parent / "fixtures"
VLLM = (FIXTURES / "vllm-0.32" / "metrics-after-traffic.txt").read_text()
SGLANG = (FIXTURES / "sglang-0.5.23" / "metrics.txt").read_text()
LLAMA = FIXTURES / "llamacpp-b11434"
# llama-server's answer to GET /metrics without --metrics (format_error_response, 501).
NO_METRICS = {
    "error": {
        "code": 501,
        "message": "This server does not support metrics endpoint. Start it with `--metrics`",
        "type": "not_supported_error",
    }
}

Routes = dict[str, Callable[[], web.Response]]


def text(body: str, status: int = 200) -> Callable[[], web.Response]:
    return lambda: web.Response(text=body, status=status)


def js(body: Any, status: int = 200) -> Callable[[], web.Response]:
    return lambda: web.json_response(body, status=status)


def models(name: str, max_model_len: int | None) -> Callable[[], web.Response]:
    card: dict[str, Any] = {"id": name, "object": "model"}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return js({"object": "list", "data": [card]})


def llama_routes(metrics: bool) -> Routes:
    return {
        "/metrics": text((LLAMA / "metrics.txt").read_text()) if metrics else js(NO_METRICS, 501),
        "/props": js(json.loads((LLAMA / "props.json").read_text())),
        "/slots": js(json.loads((LLAMA / "slots.json").read_text())),
        "/v1/models": models("Qwen2.5-7B-Instruct-Q4_K_M", None),
    }


@pytest.fixture
async def engine() -> AsyncIterator[Callable[[Routes], Any]]:
    """Serves the routes it is given; yields a function that starts one server."""
    servers: list[TestServer] = []

    async def start(routes: Routes) -> str:
        app = web.Application()
        for path, answer in routes.items():

            async def handle(_: web.Request, answer: Callable[[], web.Response] = answer) -> Any:
                return answer()

            app.router.add_get(path, handle)
        server = TestServer(app)
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for server in servers:
        await server.close()


async def read(base: str, **options: Any) -> Any:
    probe = EngineMetricsProbe(base + "/metrics", base_url=base, **options)
    try:
        return await probe.read()
    finally:
        await probe.close()


async def test_vllm_is_told_and_read_as_before(engine: Callable[[Routes], Any]) -> None:
    """vLLM's text names vLLM; its model card gives the served model and its length."""
    base = await engine({"/metrics": text(VLLM), "/v1/models": models("tiny", 1024)})
    reading = await read(base)
    assert (reading.engine, reading.pool_tokens, reading.block_size) == ("vllm", 1_048_576, 128)
    assert (reading.served_model, reading.max_model_len, reading.slots) == ("tiny", 1024, None)


async def test_sglang_is_told_by_its_metric_names(engine: Callable[[Routes], Any]) -> None:
    """SGLang's text names SGLang; its context length is its own gauge's."""
    base = await engine({"/metrics": text(SGLANG), "/v1/models": models("llama", 8192)})
    reading = await read(base)
    assert (reading.engine, reading.pool_tokens, reading.preemptions_total) == (
        "sglang",
        425_984,
        12.0,
    )
    assert (reading.served_model, reading.max_model_len) == ("llama", 131_072)


async def test_llamacpp_with_metrics_reads_its_props_too(engine: Callable[[Routes], Any]) -> None:
    """llama.cpp's text names llama.cpp; its slots and their context come from /props."""
    base = await engine(llama_routes(metrics=True))
    reading = await read(base, llamacpp_kv_unified=False)
    assert (reading.engine, reading.slots, reading.max_model_len) == ("llamacpp", 4, 4096)
    assert (reading.pool_tokens, reading.requests_running, reading.requests_waiting) == (
        16_384,
        3.0,
        2.0,
    )
    assert reading.served_model == "Qwen2.5-7B-Instruct-Q4_K_M"


async def test_llamacpp_without_metrics_is_known_by_its_props(
    engine: Callable[[Routes], Any],
) -> None:
    """/metrics answers 501 without --metrics: /props and /slots still size and load it."""
    base = await engine(llama_routes(metrics=False))
    reading = await read(base)
    assert (reading.engine, reading.pool_tokens, reading.requests_running) == (
        "llamacpp",
        4096,
        2.0,
    )


async def test_a_failing_engine_that_is_not_llamacpp_stays_an_error(
    engine: Callable[[Routes], Any],
) -> None:
    """A vLLM still starting (503, no /props) is the same temporary error as before."""
    base = await engine({"/metrics": text("starting", 503)})
    with pytest.raises(ProbeTemporaryError, match="answered HTTP 503"):
        await read(base)


async def test_a_pinned_engine_reads_only_its_dialect(engine: Callable[[Routes], Any]) -> None:
    """SIDECAR_CAPACITY_SOURCE=vllm: a llama-server without metrics is not taken for vLLM."""
    base = await engine(llama_routes(metrics=False))
    with pytest.raises(ProbeTemporaryError, match="answered HTTP 501"):
        await read(base, engine="vllm")


async def test_llamacpp_whose_props_fail_is_a_temporary_error(
    engine: Callable[[Routes], Any],
) -> None:
    """Metrics without slots cannot size a pool: retried next tick, never a pool of nothing."""
    routes = llama_routes(metrics=True) | {"/props": js({"error": "busy"}, 503)}
    base = await engine(routes)
    with pytest.raises(ProbeTemporaryError, match=r"llamacpp metrics .* /props"):
        await read(base)


def test_an_unknown_engine_name_is_refused() -> None:
    """A typo in the pinned engine fails at construction, not on the first tick."""
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        EngineMetricsProbe("http://127.0.0.1:9/metrics", engine="tgi")
