"""One demo run: the same overload, through the sidecar or straight at a fresh engine.

Both kinds sample the engine's /metrics and the clients' tally the same way, print the same live
line, and stop the same way: clients stop starting requests at the end of the phase, and streams
still unanswered ``grace_s`` later are abandoned (counted as unanswered).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import openai
from aiohttp import web

from demo.compare import RunResult, result_of
from demo.dashboard import EngineGauges, Sample, format_line, scrape_engine, watch
from demo.load import Load, Phase, Request, Tally
from demo.story import progress
from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.entry.app import SidecarServer

SAMPLE_S, LINE_S = 0.1, 1.0  # sample often enough to catch a peak; print a line every second
GRACE_S = 2.0  # streams still unanswered this long after the last start are abandoned


async def start_engine(config: EmulatorConfig) -> tuple[web.AppRunner, str]:
    """An emulated engine on a free loopback port: its runner (to clean up) and its URL."""
    runner = web.AppRunner(build_app(config), handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def client_for(base_url: str) -> openai.AsyncOpenAI:
    """The demo's client: the real SDK, no retries of its own."""
    return openai.AsyncOpenAI(base_url=base_url, api_key="demo", max_retries=0, timeout=60.0)


@dataclass
class Run:
    """One run's samples and tally; ``sidecar`` is None for a run straight at the engine."""

    label: str
    engine_url: str
    write: Callable[[str], object]
    clock: Callable[[], float]
    duration_s: float
    sidecar: SidecarServer | None = None

    def __post_init__(self) -> None:
        self.tally = Tally()
        self.samples: list[Sample] = []
        self.gauges: list[EngineGauges] = []
        self.started = self.clock()
        self._printed_at: float | None = None

    @property
    def base_url(self) -> str:
        """Where the clients send their requests."""
        if self.sidecar is None:
            return self.engine_url + "/v1"
        return f"http://127.0.0.1:{self.sidecar.proxy_port}/v1"

    async def take(self, session: aiohttp.ClientSession) -> Sample:
        """What the sidecar (if any), the engine and the clients show now."""
        engine = await scrape_engine(session, self.engine_url + "/metrics")
        self.gauges.append(engine)
        snap = None if self.sidecar is None else self.sidecar.bulkhead.snapshot()
        return Sample(
            t_s=self.clock() - self.started,
            in_use=0 if snap is None else snap.in_use,
            queued=0 if snap is None else snap.queued,
            engine_running=engine.running,
            kv_usage=engine.kv_usage,
            completed=self.tally.completed,
            fallbacks=self.tally.fallbacks,
            failed=engine.failed,
            p50_ttft_s=self.tally.p50_ttft_s(),
            preemptions=engine.preemptions,
        )

    def show(self, sample: Sample) -> None:
        """Keep every sample; print one every LINE_S seconds."""
        self.samples.append(sample)
        if self._printed_at is None or sample.t_s - self._printed_at >= LINE_S - SAMPLE_S / 2:
            self._printed_at = sample.t_s
            self.write(format_line(sample, progress(sample.t_s, self.duration_s)) + "\n")

    def result(self, phase: str) -> RunResult:
        """The run as a column of the comparison; its SLO goodput over the run's duration and
        the grace."""
        window = (self.started, self.started + self.duration_s + GRACE_S)
        return result_of(
            self.label, self.tally, phase, self.gauges, tuple(self.samples), window=window
        )


async def drive(run: Run, phase: Phase, request: Request, *, grace_s: float = GRACE_S) -> None:
    """Run the load while the dashboard watches; abandon what is unanswered after the grace."""
    async with aiohttp.ClientSession() as session, client_for(run.base_url) as client:
        run.started = run.clock()
        watcher = asyncio.create_task(
            watch(lambda: run.take(session), run.show, SAMPLE_S), name="demo-dashboard"
        )
        try:
            load = Load(client, request, run.tally, clock=run.clock).run((phase,), lambda _: None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(load, phase.duration_s + grace_s)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        crash = None if watcher.cancelled() else watcher.exception()
        if crash is not None:  # a dashboard that died must not pass for a quiet run
            raise crash
        run.show(await run.take(session))
