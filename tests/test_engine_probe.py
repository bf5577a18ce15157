"""vLLM /metrics: the pure parser against real vLLM 0.32 output, and the scraper over a socket."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from sidecar.core.errors import ProbeTemporaryError
from sidecar.live.probes.engine import parse_families, parse_metrics
from sidecar.live.probes.engine_probe import EngineMetricsProbe

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm-0.32"  # captured from vLLM 0.32

TWO_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 5.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="1000",num_gpu_blocks="62"} 1.0
vllm:cache_config_info{block_size="16",engine="1",kv_cache_size_tokens="2000",num_gpu_blocks="125"} 1.0
"""  # noqa: E501


@pytest.mark.parametrize("name", ["metrics-idle.txt", "metrics-after-traffic.txt"])
def test_real_vllm_cache_config_is_read(name: str) -> None:
    """The tiny Llama's pool: 8,192 blocks of 128 = 1,048,576 tokens in 1 GiB, dtype auto."""
    reading = parse_metrics((FIXTURES / name).read_text(), observed_at=7.0)
    cache = reading.cache
    assert cache is not None
    assert (cache.num_gpu_blocks, cache.block_size) == (8192, 128)
    assert (cache.kv_cache_size_tokens, cache.kv_cache_memory_bytes) == (1_048_576, 1_073_741_824)
    assert (cache.cache_dtype, cache.gpu_memory_utilization) == ("auto", 0.92)
    assert (reading.kv_usage_ratio, reading.requests_running, reading.observed_at) == (
        0.0,
        0.0,
        7.0,
    )


def test_real_vllm_reading_in_the_engine_neutral_terms() -> None:
    """Pool tokens, block size and bytes per token as every engine's reading states them."""
    reading = parse_metrics((FIXTURES / "metrics-idle.txt").read_text(), observed_at=0.0)
    assert (reading.engine, reading.pool_tokens, reading.block_size) == ("vllm", 1_048_576, 128)
    assert reading.bytes_per_token == 1024
    assert (reading.slots, reading.max_model_len) == (None, None)


def test_series_are_summed_over_engines_and_usage_averaged() -> None:
    """Two data-parallel engines: counts and pools add up, the usage fraction is their mean."""
    reading = parse_metrics(TWO_ENGINES, observed_at=0.0)
    assert (reading.requests_running, reading.preemptions_total) == (7.0, 7.0)
    assert reading.kv_usage_ratio == pytest.approx(0.5)
    assert reading.cache is not None
    assert (reading.cache.kv_cache_size_tokens, reading.cache.num_gpu_blocks) == (3000, 187)
    assert reading.cache.kv_cache_memory_bytes is None


def test_metrics_without_vllm_series_read_as_unknown() -> None:
    """Another engine's /metrics gives no cache config rather than made-up numbers."""
    reading = parse_metrics("# TYPE up gauge\nup 1.0\n", observed_at=0.0)
    assert (reading.cache, reading.kv_usage_ratio, reading.requests_waiting) == (None, None, None)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param((FIXTURES / "metrics-idle.txt").read_text(), id="vllm-0.32-idle"),
        pytest.param((FIXTURES / "metrics-after-traffic.txt").read_text(), id="vllm-0.32-traffic"),
        pytest.param(TWO_ENGINES, id="two-engines"),
    ],
)
def test_dropping_unread_families_first_reads_the_same(text: str) -> None:
    """Parsing only the families the probe reads gives exactly the full parse's reading."""
    assert parse_metrics(text, observed_at=3.0) == parse_families(text, observed_at=3.0)


def test_a_changed_cache_config_is_read_anew() -> None:
    """The cache configuration is remembered by its text: an engine restarted with another pool
    is read as it now is, at once."""
    first = parse_metrics(TWO_ENGINES, observed_at=0.0)
    resized = TWO_ENGINES.replace('num_gpu_blocks="125"', 'num_gpu_blocks="250"')
    second = parse_metrics(resized, observed_at=1.0)
    assert first.cache is not None
    assert second.cache is not None
    assert (first.cache.num_gpu_blocks, second.cache.num_gpu_blocks) == (187, 312)
    assert parse_metrics(TWO_ENGINES, observed_at=2.0).cache == first.cache


def test_a_broken_cache_config_line_fails_every_time() -> None:
    """A cache configuration sample the parser refuses is refused on every tick, never
    remembered as "no configuration"."""
    broken = TWO_ENGINES.replace('block_size="16",engine="1"', 'block_size="16,engine="1"')
    for _ in range(2):
        with pytest.raises(ValueError):  # noqa: PT011 - the parser's own error, whatever its text
            parse_metrics(broken, observed_at=0.0)


def test_text_that_is_not_prometheus_still_fails_to_parse() -> None:
    """The pre-parse filter keeps what it cannot name, so an HTML error page is still refused."""
    with pytest.raises(ValueError):  # noqa: PT011 - the parser's own error, whatever its text
        parse_metrics("<html><body>502 Bad Gateway</body></html>\n", observed_at=0.0)


async def serve(status: int = 200, peers: list[object] | None = None) -> TestServer:
    async def metrics(request: web.Request) -> web.Response:
        if peers is not None:
            peers.append(
                request.transport.get_extra_info("peername") if request.transport else None
            )
        return web.Response(
            text=(FIXTURES / "metrics-after-traffic.txt").read_text(), status=status
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_scraper_reads_a_live_endpoint() -> None:
    """Over a real socket, with its own session and with a shared one."""
    server = await serve()
    url = str(server.make_url("/metrics"))
    probe = EngineMetricsProbe(url, clock=lambda: 3.0)
    try:
        own = await probe.read()
        async with aiohttp.ClientSession() as session:
            shared = await EngineMetricsProbe(url, session=session).read()
    finally:
        await probe.close()
        await server.close()
    assert own.observed_at == 3.0
    assert own.cache == shared.cache
    assert own.cache is not None


@pytest.mark.parametrize(
    ("status", "message"),
    [pytest.param(503, "answered HTTP 503", id="engine-starting")],
)
async def test_failing_engine_is_a_temporary_probe_error(status: int, message: str) -> None:
    """A non-200 answer is worth retrying next tick."""
    server = await serve(status=status)
    try:
        probe = EngineMetricsProbe(str(server.make_url("/metrics")))
        with pytest.raises(ProbeTemporaryError, match=message):
            await probe.read()
        await probe.close()
    finally:
        await server.close()


async def test_unreachable_engine_is_a_temporary_probe_error() -> None:
    """Nothing listening: a clear temporary error naming the URL."""
    probe = EngineMetricsProbe("http://127.0.0.1:9/metrics")
    with pytest.raises(ProbeTemporaryError, match=r"127\.0\.0\.1:9/metrics unreachable"):
        await probe.read()
    await probe.close()


async def test_every_scrape_reuses_one_kept_alive_connection() -> None:
    """Ticks after the first open no new connection; close() ends the probe's own session."""
    peers: list[object] = []
    server = await serve(peers=peers)
    probe = EngineMetricsProbe(str(server.make_url("/metrics")))
    try:
        for _ in range(3):
            await probe.read()
        await probe.close()
        await probe.read()  # a closed probe opens afresh rather than failing
        await probe.close()
    finally:
        await server.close()
    assert len(peers) == 4
    assert peers[0] == peers[1] == peers[2]
    assert peers[3] != peers[0]


@pytest.mark.parametrize(
    ("name", "prompt", "generation"),
    [
        pytest.param("metrics-idle.txt", 17 / 3, 24.0, id="idle"),
        pytest.param("metrics-after-traffic.txt", 4.0, 300.0, id="after-traffic"),
    ],
)
def test_the_typical_request_is_read_from_vllms_length_histograms(
    name: str, prompt: float, generation: float
) -> None:
    """vllm:request_prompt_tokens and vllm:request_generation_tokens, sum over count, in vLLM
    0.32's real text: what primes the default admission's start."""
    reading = parse_metrics((FIXTURES / name).read_text(), observed_at=0.0)
    assert reading.typical_prompt_tokens == pytest.approx(prompt)
    assert reading.typical_generation_tokens == pytest.approx(generation)


def test_the_time_a_request_runs_is_read_from_vllms_inference_histogram() -> None:
    """vllm:request_inference_time_seconds, sum over count, in vLLM 0.32's real text (20
    requests, 15.79 s): the Retry-After hint's pace before the sidecar has served any."""
    reading = parse_metrics((FIXTURES / "metrics-after-traffic.txt").read_text(), observed_at=0.0)
    assert reading.typical_inference_s == pytest.approx(15.787814578999928 / 20)


def test_how_the_time_a_request_runs_is_spread_is_read_from_vllms_buckets() -> None:
    """The same histogram's buckets in vLLM 0.32's real text: 13 of 20 requests ran 0.5-0.8 s,
    7 ran 0.8-1.0 s; the 16 quantiles ascend within those buckets, 10 of them below 0.8 s, as
    Prometheus's histogram_quantile interpolates them."""
    reading = parse_metrics((FIXTURES / "metrics-after-traffic.txt").read_text(), observed_at=0.0)
    spread = reading.inference_quantiles_s
    assert len(spread) == 16
    assert list(spread) == sorted(spread)
    assert spread[0] > 0.5
    assert spread[-1] < 1.0
    assert sum(q < 0.8 for q in spread) == 10


def test_an_engine_that_ran_nothing_says_nothing_of_the_spread() -> None:
    """Buckets that counted nothing (vLLM's idle fixture ran 3 warm-up requests: emptied
    here) give no quantiles rather than zeros."""
    text = (FIXTURES / "metrics-idle.txt").read_text()
    empty = "\n".join(
        line.rsplit(" ", 1)[0] + " 0.0" if line.startswith("vllm:request_inference_time") else line
        for line in text.splitlines()
    )
    assert parse_metrics(empty + "\n", observed_at=0.0).inference_quantiles_s == ()
