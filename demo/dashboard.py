"""The demo's live text: one line per sample interval, and the summary at the end.

Samples are plain values; formatting and summarising them is pure. The engine's gauges are
scraped from its ``/metrics`` like any Prometheus would, with ``prometheus_client.parser``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sidecar.live.probes.engine_probe import engine_of

T = TypeVar("T")


@dataclass(frozen=True)
class EngineSeries:
    """The series one engine's /metrics names its load by (None: that engine has none)."""

    running: str
    kv_usage: str | None
    preemptions: str | None
    success: str | None  # by finished_reason; "error" counts the failed


# The engine is told by its metric names' prefix, as the sidecar tells it (docs/sglang.md,
# docs/llamacpp.md); the emulator serves each of these with --engine.
SERIES = {
    "vllm": EngineSeries(
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions",
        "vllm:request_success",
    ),
    "sglang": EngineSeries(
        "sglang:num_running_reqs", "sglang:token_usage", "sglang:num_retracted_requests", None
    ),
    "llamacpp": EngineSeries("llamacpp:requests_processing", None, None, None),
}


@dataclass(frozen=True)
class EngineGauges:
    """What the engine's /metrics says now."""

    running: int
    kv_usage: float = 0.0  # 0..1
    preemptions: int = 0  # since start
    failed: int = 0  # requests the engine ended with an error (oom mode: CUDA out of memory)


@dataclass(frozen=True)
class Sample:
    """What one run shows at one moment: the sidecar's side is zero in a run without it."""

    t_s: float
    in_use: int  # admitted by the sidecar now
    queued: int  # waiting at the sidecar
    engine_running: int
    kv_usage: float  # 0..1
    completed: int
    fallbacks: int  # busy answers so far
    failed: int  # streams the engine failed so far (oom mode)
    p50_ttft_s: float | None
    preemptions: int = 0  # the engine's, so far


def engine_running(metrics_text: str) -> int:
    """Requests the engine runs now, summed over its engines, from a /metrics page."""
    return engine_gauges(metrics_text).running


def engine_gauges(metrics_text: str) -> EngineGauges:
    """The engine's running count, KV use, preemptions and failed requests, summed over engines
    (vLLM, SGLang or llama.cpp, told by the names on the page)."""
    series = SERIES[engine_of(metrics_text) or "vllm"]
    totals: dict[str | None, float] = {}
    kv: list[float] = []
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")  # however the page declares the family
            if name == series.success and sample.labels.get("finished_reason") != "error":
                continue
            if name == series.kv_usage:
                kv.append(sample.value)
            elif name in (series.running, series.preemptions, series.success):
                totals[name] = totals.get(name, 0.0) + sample.value
    if series.running not in totals:
        raise ValueError(f"the engine's /metrics has no {series.running}")
    return EngineGauges(
        running=int(totals[series.running]),
        kv_usage=max(kv, default=0.0),
        preemptions=int(totals.get(series.preemptions, 0)),
        failed=int(totals.get(series.success, 0)),
    )


async def scrape_engine(session: aiohttp.ClientSession, metrics_url: str) -> EngineGauges:
    """Fetch and read the engine's gauges."""
    async with session.get(metrics_url) as response:
        response.raise_for_status()
        return engine_gauges(await response.text())


def _ms(seconds: float | None) -> str:
    return "    -" if seconds is None else f"{seconds * 1000:5.0f}"


HEADER = "  time  in use  queued  engine  KV use  done  busy  failed  TTFT ms  progress"


def legend(max_queue: int, max_wait_s: float) -> tuple[str, ...]:
    """What the live columns mean, with the sidecar's queue bounds as the run sets them."""
    return (
        "columns: in use = requests the sidecar has let in now; queued = waiting at the",
        f"  sidecar (at most {max_queue}, for at most {max_wait_s:g} s); engine = requests the "
        "engine runs now",
        "  (its /metrics); KV use = share of its KV blocks in use; done / busy / failed = streams",
        "  completed / busy answers / streams the engine failed so far; TTFT = median time to",
        "  first token of the completed streams so far, queue wait included.",
    )


def format_line(sample: Sample, progress: str = "") -> str:
    """One live line, with the run's progress bar at the end."""
    return (
        f"{sample.t_s:5.1f}s  {sample.in_use:6d}  {sample.queued:6d}  {sample.engine_running:6d}  "
        f"{sample.kv_usage:6.0%}  {sample.completed:4d}  {sample.fallbacks:4d}  "
        f"{sample.failed:6d}  {_ms(sample.p50_ttft_s):>7}  {progress}"
    ).rstrip()


async def watch(
    take: Callable[[], Awaitable[T]],
    on_sample: Callable[[T], None],
    interval_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Take a sample every ``interval_s`` until cancelled."""
    while True:
        on_sample(await take())
        await sleep(interval_s)
