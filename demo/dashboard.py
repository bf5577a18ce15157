"""The demo's live text: one line per sample interval, and the summary at the end.

Samples are plain values; formatting and summarising them is pure. The engine's gauges are
scraped from its ``/metrics`` like any Prometheus would, with ``prometheus_client.parser``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
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
    """Everything one dashboard line shows, taken at one moment."""

    t_s: float
    phase: str
    permits: int
    in_use: int
    queued: int
    engine_running: int
    completed: int
    fallbacks: int
    p50_ttft_s: float | None
    kv_usage: float = 0.0


@dataclass(frozen=True)
class PhaseSummary:
    """One phase: the permits seen during it and what its clients got."""

    name: str
    permits_min: int
    permits_max: int
    outcomes: dict[str, int]


@dataclass(frozen=True)
class Summary:
    """The run, as the test and the closing lines report it."""

    outcomes: dict[str, int]
    phases: tuple[PhaseSummary, ...]
    max_permits: int
    final_permits: int
    max_in_use: int
    max_engine_running: int
    p50_ttft_s: float | None

    def phase(self, name: str) -> PhaseSummary:
        """The summary of the phase called ``name``."""
        return next(p for p in self.phases if p.name == name)


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


HEADER = "  time  permits  in use  queued  engine  KV use  done  busy  TTFT ms  progress"
LEGEND = (
    "columns: permits = requests the sidecar lets in at once (its plan); in use = admitted now;",
    "  queued = waiting for a permit (at most 8, for at most 1.5 s); engine = requests the engine",
    "  runs now (from its /metrics); KV use = share of the engine's KV blocks in use;",
    "  done / busy = streams completed / busy answers so far; TTFT = median time to first token",
    "  in this phase, queue wait included.",
)


def format_line(sample: Sample, progress: str = "") -> str:
    """One live line, with the run's progress bar at the end."""
    return (
        f"{sample.t_s:5.1f}s  {sample.permits:7d}  {sample.in_use:6d}  {sample.queued:6d}  "
        f"{sample.engine_running:6d}  {sample.kv_usage:6.0%}  {sample.completed:4d}  "
        f"{sample.fallbacks:4d}  {_ms(sample.p50_ttft_s):>7}  {progress}"
    ).rstrip()


def summarize(
    samples: Iterable[Sample],
    phase_names: Iterable[str],
    outcomes: dict[str, int],
    by_phase: dict[str, dict[str, int]],
    p50_ttft_s: float | None,
) -> Summary:
    """Fold the samples and the clients' tally into the summary; needs at least one sample."""
    taken = list(samples)
    if not taken:
        raise ValueError("no samples were taken")
    phases = []
    for name in phase_names:
        permits = [s.permits for s in taken if s.phase == name] or [0]
        phases.append(PhaseSummary(name, min(permits), max(permits), dict(by_phase.get(name, {}))))
    return Summary(
        outcomes=dict(outcomes),
        phases=tuple(phases),
        max_permits=max(s.permits for s in taken),
        final_permits=taken[-1].permits,
        max_in_use=max(s.in_use for s in taken),
        max_engine_running=max(s.engine_running for s in taken),
        p50_ttft_s=p50_ttft_s,
    )


def format_summary(summary: Summary) -> list[str]:
    """The closing lines."""
    total = sum(summary.outcomes.values())
    lines = [f"requests: {total}  " + _counts(summary.outcomes)]
    for phase in summary.phases:
        permits = f"{phase.permits_min}" + (
            f"..{phase.permits_max}" if phase.permits_max != phase.permits_min else ""
        )
        lines.append(f"  {phase.name:<17} permits {permits:<7} {_counts(phase.outcomes)}")
    verdict = "never above" if summary.max_engine_running <= summary.max_permits else "ABOVE"
    lines.append(
        f"max engine running {summary.max_engine_running} vs max permits "
        f"{summary.max_permits}: {verdict} the limit; max in use {summary.max_in_use}; "
        f"permits at the end {summary.final_permits}; p50 TTFT {_ms(summary.p50_ttft_s).strip()} ms"
    )
    return lines


def _counts(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(outcomes.items())) or "no requests"


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
