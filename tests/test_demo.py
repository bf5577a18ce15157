"""The demo: its simulated GPU through the sidecar's math, its dashboard, and one real short run."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from typing import Any

import openai
import pytest

from demo.__main__ import (
    BYTES_PER_TOKEN,
    COMPLETION_BUDGET,
    MODEL,
    PROMPT_BUDGET,
    WEIGHTS,
    gpu_layout,
    main,
    run_demo,
)
from demo.dashboard import (
    Sample,
    engine_gauges,
    engine_running,
    format_line,
    format_summary,
    summarize,
)
from demo.load import FALLBACK_CODES, Tally, outcome_of
from demo.simulated_gpu import ENGINE_PID, GIB, NEIGHBOUR_PID, SimulatedGpu
from demo.story import PATH_HINT, progress
from sidecar.core.capacity import Budget, KvCost, make_plan
from sidecar.core.model_spec import load_model_spec
from sidecar.live.probes.static import Declared
from sidecar.live.sources import Readings, engine_process_bytes, neighbour_bytes, plan_inputs

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen2.5-7b"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen2.5-7b"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen2.5-7b"} 9.0
"""


def _sample(t_s: float, phase: str, permits: int, running: int) -> Sample:
    return Sample(t_s, phase, permits, running, 0, running, 0, 0, None)


async def _permits(neighbour: int) -> int:
    """The permits the sidecar's own NVML math gives for the simulated card."""
    gpu = SimulatedGpu(gpu_layout(), clock=lambda: 1.0)
    gpu.set_neighbour(neighbour)
    declared = Declared(None, WEIGHTS, False, 2 * GIB, None, observed_at=0.0)
    readings = Readings(declared, gpus=await gpu.read())
    cost = KvCost(load_model_spec(MODEL), block_size=16)
    inputs = plan_inputs("nvml", readings, cost, engine_pid=None, tolerance=0.1)
    return make_plan(cost, inputs.memory, Budget(PROMPT_BUDGET, COMPLETION_BUDGET), 0.8).permits


@pytest.mark.parametrize(
    ("neighbour", "permits"),
    [
        pytest.param(0, 14, id="alone-on-the-card"),
        pytest.param(4 * GIB, 7, id="4GiB-neighbour"),
    ],
)
async def test_simulated_card_gives_the_documented_permits(neighbour: int, permits: int) -> None:
    """24 GiB card, qwen2.5-7b, 8,000-token budget: 14 permits, 7 beside a 4 GiB neighbour."""
    assert await _permits(neighbour) == permits


async def test_neighbour_is_seen_as_a_neighbour_not_the_engine() -> None:
    """NVML-style readings list the engine as the largest process and the neighbour beside it."""
    gpu = SimulatedGpu(gpu_layout())
    gpu.set_neighbour(4 * GIB)
    reading = (await gpu.read()).gpus[0]
    assert {p.pid for p in reading.processes} == {ENGINE_PID, NEIGHBOUR_PID}
    assert engine_process_bytes(reading, None) == gpu.layout.engine_bytes
    assert neighbour_bytes(reading, None) == 4 * GIB
    assert reading.unlisted_bytes == gpu.layout.driver_bytes


def test_engine_kv_pool_is_whole_blocks_of_the_model() -> None:
    """The emulated engine's pool is a whole number of 16-token qwen2.5-7b blocks."""
    layout = gpu_layout()
    assert layout.kv_pool_bytes % (16 * BYTES_PER_TOKEN) == 0
    assert layout.engine_bytes + layout.driver_bytes <= layout.total_bytes


def test_negative_neighbour_is_refused() -> None:
    """A neighbour cannot hold negative memory."""
    with pytest.raises(ValueError, match="cannot hold"):
        SimulatedGpu(gpu_layout()).set_neighbour(-1)


def test_engine_running_sums_every_engine() -> None:
    """The dashboard's engine count adds up the running gauge of every engine on the page."""
    assert engine_running(VLLM_METRICS) == 5


def test_engine_running_without_the_gauge_is_an_error() -> None:
    """A /metrics page without the running gauge is reported, not read as zero."""
    with pytest.raises(ValueError, match="num_requests_running"):
        engine_running("# TYPE other gauge\nother 1.0\n")


def _sdk_request() -> Any:
    """A request of the HTTP library the installed SDK uses (httpx, or httpx2 from openai 3.x):
    newer SDKs read its headers when an error is made."""
    try:
        http = importlib.import_module("httpx2")
    except ImportError:
        http = importlib.import_module("httpx")
    return http.Request("POST", "http://127.0.0.1/v1/chat/completions")


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        pytest.param("queue_full", "queue_full", id="queue-full"),
        pytest.param("timeout", "timeout", id="timeout"),
        pytest.param("invalid_json", "error", id="not-a-fallback"),
        pytest.param(None, "error", id="no-code"),
    ],
)
def test_outcome_of_an_sdk_error(code: str | None, outcome: str) -> None:
    """Only the sidecar's busy codes count as fallbacks; any other SDK error is an error."""
    body = {"message": "busy", "code": code}
    exc = openai.APIError("busy", _sdk_request(), body=body)
    assert outcome_of(exc) == outcome


def test_tally_counts_fallbacks_and_median_ttft_per_phase() -> None:
    """Fallbacks are the busy codes only, and the p50 TTFT is per phase or overall."""
    tally = Tally()
    for phase, outcome in [("a", "completed"), ("a", "queue_full"), ("b", "timeout")]:
        tally.record(phase, outcome)
    tally.record("b", "error")
    for phase, ttft in [("a", 0.1), ("a", 0.3), ("b", 2.0)]:
        tally.first_token(phase, ttft)
    assert (tally.completed, tally.fallbacks) == (1, 2)
    assert tally.p50_ttft_s("a") == pytest.approx(0.2)
    assert tally.p50_ttft_s() == pytest.approx(0.3)
    assert tally.p50_ttft_s("c") is None


def test_summary_flags_an_engine_above_the_permits() -> None:
    """A sample with the engine running more than any permit limit makes the summary say ABOVE."""
    samples = [_sample(0.0, "steady", 4, 2), _sample(0.5, "burst", 4, 6)]
    summary = summarize(samples, ["steady", "burst"], {"completed": 3}, {}, None)
    assert summary.max_engine_running > summary.max_permits
    assert "ABOVE the limit" in format_summary(summary)[-1]


def test_summary_needs_samples() -> None:
    """Summarising a run that took no sample is an error, not an empty success."""
    with pytest.raises(ValueError, match="no samples"):
        summarize([], ["steady"], {}, {}, None)


def test_line_shows_every_column() -> None:
    """A live line: time, permits, in use, queued, engine running, KV use, totals, TTFT, bar."""
    line = format_line(Sample(1.5, "burst", 14, 13, 8, 12, 40, 7, 0.25, 0.49), "[##..] 3 s left")
    assert line.split() == [
        "1.5s", "14", "13", "8", "12", "49%", "40", "7", "250", "[##..]", "3", "s", "left"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("elapsed", "total", "bar"),
    [
        pytest.param(0.0, 20.0, "[....................]  20 s left", id="start"),
        pytest.param(5.0, 20.0, "[#####...............]  15 s left", id="quarter"),
        pytest.param(25.0, 20.0, "[####################]   0 s left", id="overrun"),
    ],
)
def test_progress_bar_shows_the_time_left(elapsed: float, total: float, bar: str) -> None:
    """The bar fills with the run and counts down the seconds left, never below zero."""
    assert progress(elapsed, total) == bar


def test_engine_gauges_read_kv_use_preemptions_and_failures() -> None:
    """The engine's page gives running, KV use, preemptions and error-finished requests."""
    page = VLLM_METRICS + (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.75\n'
        "# TYPE vllm:num_preemptions counter\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 4.0\n'
        "# TYPE vllm:request_success counter\n"
        'vllm:request_success_total{engine="0",finished_reason="error",model_name="m"} 3.0\n'
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 9.0\n'
    )
    gauges = engine_gauges(page)
    assert (gauges.running, gauges.kv_usage, gauges.preemptions, gauges.failed) == (5, 0.75, 4, 3)


@pytest.mark.parametrize(
    ("page", "running", "kv_usage", "preemptions"),
    [
        pytest.param(
            "# TYPE sglang:num_running_reqs gauge\n"
            'sglang:num_running_reqs{tp_rank="0"} 6.0\n'
            "# TYPE sglang:token_usage gauge\n"
            'sglang:token_usage{tp_rank="0"} 0.5\n'
            "# TYPE sglang:num_retracted_requests counter\n"
            'sglang:num_retracted_requests_total{tp_rank="0"} 2.0\n',
            6,
            0.5,
            2,
            id="sglang",
        ),
        pytest.param(
            "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 3\n",
            3,
            0.0,
            0,
            id="llamacpp",
        ),
    ],
)
def test_engine_gauges_read_each_engines_names(
    page: str, running: int, kv_usage: float, preemptions: int
) -> None:
    """The dashboard reads SGLang's and llama.cpp's pages by their own names (demo --engine)."""
    gauges = engine_gauges(page)
    assert (gauges.running, gauges.kv_usage, gauges.preemptions) == (running, kv_usage, preemptions)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--duration", "0"], id="zero-duration"),
        pytest.param(["--clients", "0"], id="no-clients"),
    ],
)
def test_bad_flags_exit_2(argv: list[str]) -> None:
    """Nonsense flags stop the demo with status 2 before anything starts."""
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2


@pytest.mark.timeout(60)
async def test_short_run_admits_queues_falls_back_and_follows_the_neighbour(
    tmp_path: Path,
) -> None:
    """9 s run: steady admitted, burst falls back, engine within permits, neighbour shrinks them;
    then the burst without the sidecar preempts or fails streams; a PNG; the PATH hint last."""
    lines: list[str] = []
    result = await run_demo(duration_s=9.0, write=lines.append, picture=tmp_path / "t.png")
    summary = result.summary

    steady, burst = summary.phase("steady"), summary.phase("burst")
    neighbour, gone = summary.phase("noisy neighbour"), summary.phase("neighbour gone")
    assert steady.outcomes.get("completed", 0) > 0
    assert set(steady.outcomes) == {"completed"}
    assert burst.outcomes.get("completed", 0) > 0
    assert sum(n for code, n in burst.outcomes.items() if code in FALLBACK_CODES) > 0
    assert summary.max_permits == 14
    assert summary.max_in_use == summary.max_permits
    assert 0 < summary.max_engine_running <= summary.max_permits
    assert neighbour.permits_min == 7
    assert gone.permits_max == summary.final_permits == 14
    assert asyncio.all_tasks() == {asyncio.current_task()}
    text = "".join(lines)
    assert "floor(14.63) = 14" in lines[0]
    assert "permits 14 -> 7 (a 4.00 GiB neighbour)" in text
    assert "never above the limit" in text
    with_sidecar, paged, oom = result.comparison
    assert with_sidecar.outcomes.get("error", 0) == with_sidecar.preemptions == 0
    assert with_sidecar.max_engine_running <= 14 < paged.max_engine_running
    assert paged.preemptions > 0
    assert oom.outcomes.get("error", 0) > 0
    assert result.picture is not None
    assert result.picture.read_bytes().startswith(b"\x89PNG")
    assert lines[-1].strip().endswith(PATH_HINT)
