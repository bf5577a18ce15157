"""``python -m demo``: a simulated GPU, the emulated engine, the real sidecar between them, load.

No GPU and no engine needed. The sidecar sizes its permits through its real NVML path from the
simulated card, the engine's KV pool is exactly what that card leaves for it, and streaming
clients (the openai SDK) show admissions, queueing and fallbacks, then a noisy neighbour.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence

import aiohttp
import openai
from aiohttp import web

from demo.dashboard import (
    HEADER,
    Sample,
    Summary,
    format_line,
    format_summary,
    scrape_engine_running,
    summarize,
    watch,
)
from demo.load import Load, Phase, Request, Tally
from demo.simulated_gpu import GIB, GpuLayout, SimulatedGpu
from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.entry.app import SidecarServer
from sidecar.entry.logs import configure_logging
from sidecar.entry.settings import Settings, load_settings

MODEL = "qwen2.5-7b"
BYTES_PER_TOKEN = 57_344  # qwen2.5-7b, fp16 KV: 2 x 28 layers x 4 KV heads x 128 x 2 bytes
BLOCK_TOKENS = 16
PROMPT_BUDGET, COMPLETION_BUDGET = 6000, 2000  # 8,000 tokens = 458,752,000 B per request
WEIGHTS = 15_231_233_024  # Qwen2.5-7B's bf16 safetensors
NEIGHBOUR = 4 * GIB
MAX_TOKENS, TOKENS_PER_S, TTFT_S = 48, 40.0, 0.1
STREAM_S = TTFT_S + MAX_TOKENS / TOKENS_PER_S + 0.2  # one stream, with some slack
SAMPLE_S, LINE_S = 0.1, 0.5  # sample often enough to catch a peak; print a line every 0.5 s
# Phase lengths as shares of --duration.
SHARES = {"steady": 0.2, "burst": 0.3, "noisy neighbour": 0.3, "neighbour gone": 0.2}


def gpu_layout() -> GpuLayout:
    """A 24 GiB card: weights, 1.5 GiB engine overhead, 0.5 GiB driver, the rest KV in blocks."""
    total, overhead, driver = 24 * GIB, 3 * GIB // 2, GIB // 2
    block_bytes = BLOCK_TOKENS * BYTES_PER_TOKEN
    pool = (total - WEIGHTS - overhead - driver) // block_bytes * block_bytes
    return GpuLayout(total, WEIGHTS, overhead, driver, pool)


def engine_config(layout: GpuLayout) -> EmulatorConfig:
    """The emulated engine, sized to the simulated card's KV pool; a stream lasts ~1.3 s."""
    return EmulatorConfig(
        model_name=MODEL,
        max_model_len=8192,
        kv_tokens=layout.kv_pool_bytes // BYTES_PER_TOKEN,
        block_size=BLOCK_TOKENS,
        max_num_seqs=256,
        tokens_per_s=TOKENS_PER_S,
        ttft_s=TTFT_S,
        bytes_per_token=BYTES_PER_TOKEN,
    )


def sidecar_settings(engine_url: str) -> Settings:
    """The real sidecar, planning from NVML readings (the simulated card) every 250 ms."""
    env = {
        "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_ADMIN_HOST": "127.0.0.1",
        "SIDECAR_UPSTREAM_URL": engine_url,
        "SIDECAR_CAPACITY_SOURCE": "nvml",
        "SIDECAR_MODEL": MODEL,
        "SIDECAR_WEIGHTS": str(WEIGHTS),
        "SIDECAR_BLOCK_SIZE": str(BLOCK_TOKENS),
        "SIDECAR_MAX_PROMPT_TOKENS": str(PROMPT_BUDGET),
        "SIDECAR_MAX_COMPLETION_TOKENS": str(COMPLETION_BUDGET),
        "SIDECAR_SAFETY_FACTOR": "0.8",
        "SIDECAR_REFRESH_MS": "250",
        "SIDECAR_MAX_QUEUE": "8",
        "SIDECAR_MAX_WAIT_MS": "1500",
        "SIDECAR_LOG_LEVEL": "warning",
    }
    # Port 0 (any free port) is what a demo wants; SIDECAR_PORT only accepts 1-65535.
    return load_settings(env).model_copy(update={"port": 0, "admin_port": 0})


def phases(duration_s: float, permits: int, burst_clients: int | None) -> tuple[Phase, ...]:
    """Under capacity, several times capacity, a neighbour taking memory, the neighbour gone."""
    burst = burst_clients if burst_clients is not None else 4 * permits
    steady = max(1, permits // 2)
    return (
        # Steady ends quiet so none of its streams meets the burst.
        Phase("steady", SHARES["steady"] * duration_s, steady, think_s=0.3, settle_s=STREAM_S),
        Phase("burst", SHARES["burst"] * duration_s, burst),
        Phase("noisy neighbour", SHARES["noisy neighbour"] * duration_s, permits, NEIGHBOUR),
        Phase("neighbour gone", SHARES["neighbour gone"] * duration_s, permits),
    )


async def _start_engine(config: EmulatorConfig) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(build_app(config), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def describe_plan(server: SidecarServer, layout: GpuLayout) -> list[str]:
    """The opening lines: the card, the model, the budget and the permits they give."""
    plan = server.controller.state.plan
    if plan is None:
        return [f"no plan yet: {server.controller.state.error}"]
    return [
        f"simulated GPU {layout.total_bytes / GIB:.1f} GiB: weights {layout.weights_bytes:,} B, "
        f"engine overhead {layout.engine_overhead_bytes / GIB:.1f} GiB, "
        f"driver {layout.driver_bytes / GIB:.1f} GiB, KV pool {layout.kv_pool_bytes:,} B",
        f"model {MODEL}: {plan.kv_bytes_per_token:,} B/token; budget {plan.request_max_tokens:,}"
        f" tokens = {plan.request_max_bytes:,} B/request; alpha {plan.alpha}",
        f"sidecar (source {server.controller.state.source}): KV pool {plan.kv_pool_bytes:,} B"
        f" -> {float(plan.permits_exact):.2f} -> {plan.permits} permits",
    ]


class Run:
    """One demo run's moving parts, wired together."""

    def __init__(
        self,
        server: SidecarServer,
        gpu: SimulatedGpu,
        engine_url: str,
        write: Callable[[str], object],
        clock: Callable[[], float],
    ) -> None:
        self.server, self.gpu, self.write, self.clock = server, gpu, write, clock
        self.metrics_url = engine_url + "/metrics"
        self.tally = Tally()
        self.samples: list[Sample] = []
        self.phase = "starting"
        self.started = clock()
        self._printed_at: float | None = None

    def enter(self, phase: Phase) -> None:
        """A phase starts: put its neighbour on the card (the control loop will notice)."""
        self.phase = phase.name
        self.gpu.set_neighbour(phase.neighbour_bytes)

    async def take(self, session: aiohttp.ClientSession) -> Sample:
        """What the sidecar, the engine and the clients show now."""
        running = await scrape_engine_running(session, self.metrics_url)
        snap = self.server.bulkhead.snapshot()
        return Sample(
            t_s=self.clock() - self.started,
            phase=self.phase,
            permits=snap.limit,
            in_use=snap.in_use,
            queued=snap.queued,
            engine_running=running,
            completed=self.tally.completed,
            fallbacks=self.tally.fallbacks,
            p50_ttft_s=self.tally.p50_ttft_s(self.phase),
        )

    def show(self, sample: Sample, *, always: bool = False) -> None:
        """Keep every sample; print one every LINE_S seconds."""
        self.samples.append(sample)
        due = self._printed_at is None or sample.t_s - self._printed_at >= LINE_S - SAMPLE_S / 2
        if due or always:
            self._printed_at = sample.t_s
            self.write(format_line(sample) + "\n")


async def drive(run: Run, plan: tuple[Phase, ...]) -> None:
    """Run the load while the dashboard watches; stop watching once every client is done."""
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{run.server.proxy_port}/v1",
        api_key="demo",
        max_retries=0,
        timeout=30.0,
    )
    async with aiohttp.ClientSession() as session, client:
        run.started = run.clock()
        watcher = asyncio.create_task(
            watch(lambda: run.take(session), run.show, SAMPLE_S), name="demo-dashboard"
        )
        try:
            await Load(
                client, Request(MODEL, max_tokens=MAX_TOKENS), run.tally, clock=run.clock
            ).run(plan, run.enter)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        crash = None if watcher.cancelled() else watcher.exception()
        if crash is not None:  # a dashboard that died must not pass for a quiet run
            raise crash
        run.show(await run.take(session), always=True)


async def run_demo(
    duration_s: float = 30.0,
    clients: int | None = None,
    write: Callable[[str], object] = sys.stdout.write,
    clock: Callable[[], float] = time.monotonic,
) -> Summary:
    """The whole demo; returns its summary after everything has stopped."""
    layout = gpu_layout()
    gpu = SimulatedGpu(layout, clock=clock)
    engine, engine_url = await _start_engine(engine_config(layout))
    try:
        server = SidecarServer(sidecar_settings(engine_url), clock=clock, gpu_probe=gpu)
        await server.start()
        try:
            write("\n".join(describe_plan(server, layout)) + "\n\n" + HEADER + "\n")
            run = Run(server, gpu, engine_url, write, clock)
            plan = phases(duration_s, server.bulkhead.snapshot().limit, clients)
            await drive(run, plan)
            await server.drain(5.0)
        finally:
            await server.stop()
    finally:
        await engine.cleanup()
    summary = _summary(run, plan)
    write("\n" + "\n".join(format_summary(summary)) + "\n")
    return summary


def _summary(run: Run, plan: tuple[Phase, ...]) -> Summary:
    by_phase = {name: dict(counts) for name, counts in run.tally.by_phase.items()}
    outcomes = dict(run.tally.outcomes)
    names = [phase.name for phase in plan]
    return summarize(run.samples, names, outcomes, by_phase, run.tally.p50_ttft_s())


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, run the demo, exit 0."""
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds (default 30)")
    parser.add_argument("--clients", type=int, default=None, help="burst clients (4 x permits)")
    args = parser.parse_args(argv)
    if args.duration <= 0 or (args.clients is not None and args.clients < 1):
        parser.error("--duration must be positive and --clients at least 1")
    configure_logging("warning", sys.stderr)
    asyncio.run(run_demo(args.duration, args.clients))
    return 0


if __name__ == "__main__":
    sys.exit(main())
