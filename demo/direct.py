"""The same burst with no sidecar: the clients straight at an engine, which preempts or crashes.

A fresh emulated engine per run, sized like the sidecar's: ``oom=False`` pages and preempts
(vLLM's behaviour), ``oom=True`` fails every running stream when its KV cache runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import openai
from aiohttp import web

from demo.dashboard import EngineGauges, scrape_engine, watch
from demo.load import Load, Phase, Request, Tally
from emulator.app import build_app
from emulator.config import EmulatorConfig


@dataclass(frozen=True)
class RunResult:
    """One burst as the comparison shows it."""

    label: str
    sent: int
    outcomes: dict[str, int]
    max_engine_running: int
    max_kv_usage: float
    preemptions: int
    engine_failed: int
    p50_ttft_s: float | None
    p95_ttft_s: float | None


async def start_engine(config: EmulatorConfig) -> tuple[web.AppRunner, str]:
    """An emulated engine on a free loopback port: its runner (to clean up) and its URL."""
    runner = web.AppRunner(build_app(config), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def client_for(base_url: str) -> openai.AsyncOpenAI:
    """The demo's client: the real SDK, no retries of its own."""
    return openai.AsyncOpenAI(base_url=base_url, api_key="demo", max_retries=0, timeout=60.0)


def result_of(
    label: str, tally: Tally, phase: str, peaks: list[EngineGauges], last: EngineGauges
) -> RunResult:
    """Fold one burst's tally and engine readings into its comparison column."""
    return RunResult(
        label=label,
        sent=tally.started[phase],
        outcomes=dict(tally.by_phase.get(phase, {})),
        max_engine_running=max((g.running for g in peaks), default=0),
        max_kv_usage=max((g.kv_usage for g in peaks), default=0.0),
        preemptions=last.preemptions,
        engine_failed=last.failed,
        p50_ttft_s=tally.ttft_quantile_s(0.5, phase),
        p95_ttft_s=tally.ttft_quantile_s(0.95, phase),
    )


async def burst_direct(
    config: EmulatorConfig,
    phase: Phase,
    request: Request,
    label: str,
    *,
    clock: Callable[[], float] = time.monotonic,
    sample_s: float = 0.1,
    grace_s: float = 3.0,
) -> RunResult:
    """Run ``phase`` straight at a fresh engine; stop it; return what the clients and it saw.

    Requests still unanswered ``grace_s`` after the phase are abandoned (counted as unfinished).
    """
    engine, url = await start_engine(config)
    tally, peaks = Tally(), list[EngineGauges]()
    try:
        async with aiohttp.ClientSession() as session, client_for(url + "/v1") as client:

            async def take() -> EngineGauges:
                return await scrape_engine(session, url + "/metrics")

            watcher = asyncio.create_task(watch(take, peaks.append, sample_s), name="demo-direct")
            try:
                load = Load(client, request, tally, clock=clock).run((phase,), lambda _: None)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(load, phase.duration_s + grace_s)
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            last = await take()
    finally:
        await engine.cleanup()
    return result_of(label, tally, phase.name, peaks, last)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def format_comparison(results: tuple[RunResult, ...], busy_codes: frozenset[str]) -> list[str]:
    """The closing table: one column per run of the burst."""
    rows: list[tuple[str, list[str]]] = [
        ("requests sent", [str(r.sent) for r in results]),
        ("streams completed", [str(r.outcomes.get("completed", 0)) for r in results]),
        (
            "busy answers (retry later)",
            [str(sum(n for k, n in r.outcomes.items() if k in busy_codes)) for r in results],
        ),
        ("streams failed (engine OOM)", [str(r.outcomes.get("error", 0)) for r in results]),
        ("no answer yet when stopped", [str(r.sent - sum(r.outcomes.values())) for r in results]),
        ("engine preemptions", [str(r.preemptions) for r in results]),
        ("most running at the engine", [str(r.max_engine_running) for r in results]),
        ("peak KV use", [f"{r.max_kv_usage:.0%}" for r in results]),
        ("p50 TTFT ms (completed)", [_ms(r.p50_ttft_s) for r in results]),
        ("p95 TTFT ms (completed)", [_ms(r.p95_ttft_s) for r in results]),
    ]
    width = max(len(r.label) for r in results) + 2
    lines = [f"{'':<28}" + "".join(f"{r.label:>{width}}" for r in results)]
    for name, cells in rows:
        lines.append(f"{name:<28}" + "".join(f"{cell:>{width}}" for cell in cells))
    return lines
