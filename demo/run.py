"""One demo run with the sidecar: its moving parts, the live table, and what it adds up to."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from demo.dashboard import (
    EngineGauges,
    Sample,
    Summary,
    format_line,
    scrape_engine,
    summarize,
    watch,
)
from demo.direct import RunResult, client_for, result_of
from demo.load import Load, Phase, Request, Tally
from demo.simulated_gpu import SimulatedGpu
from demo.story import PlanFigures, permits_changed, phase_reason, progress
from sidecar.entry.app import SidecarServer

SAMPLE_S, LINE_S = 0.1, 1.0  # sample often enough to catch a peak; print a line every second


def plan_figures(server: SidecarServer) -> PlanFigures:
    """The sidecar's plan now, as the story quotes it."""
    plan = server.controller.state.plan
    if plan is None:
        raise RuntimeError(f"the sidecar has no plan: {server.controller.state.error}")
    return PlanFigures(
        kv_pool_bytes=plan.kv_pool_bytes,
        request_tokens=plan.request_max_tokens,
        request_bytes=plan.request_max_bytes,
        bytes_per_token=plan.kv_bytes_per_token,
        alpha=plan.alpha,
        permits_exact=float(plan.permits_exact),
        permits=plan.permits,
    )


class Run:
    """The sidecar's run: samples every SAMPLE_S, prints a line every LINE_S or on a change."""

    def __init__(
        self,
        server: SidecarServer,
        gpu: SimulatedGpu,
        engine_url: str,
        write: Callable[[str], object],
        *,
        clock: Callable[[], float],
        duration_s: float,
    ) -> None:
        self.server, self.gpu, self.write, self.clock = server, gpu, write, clock
        self.metrics_url = engine_url + "/metrics"
        self.duration_s = duration_s
        self.tally = Tally()
        self.samples: list[Sample] = []
        self.gauges: list[tuple[str, EngineGauges]] = []
        self.phase = "starting"
        self.started = clock()
        self._printed_at: float | None = None

    def enter(self, phase: Phase) -> None:
        """A phase starts: say why, put its neighbour on the card (the control loop will notice)."""
        permits = self.server.bulkhead.snapshot().limit
        self.write(phase_reason(phase.name, phase.clients, permits, phase.neighbour_bytes) + "\n")
        self.phase = phase.name
        self.gpu.set_neighbour(phase.neighbour_bytes)

    async def take(self, session: aiohttp.ClientSession) -> Sample:
        """What the sidecar, the engine and the clients show now."""
        engine = await scrape_engine(session, self.metrics_url)
        self.gauges.append((self.phase, engine))
        snap = self.server.bulkhead.snapshot()
        return Sample(
            t_s=self.clock() - self.started,
            phase=self.phase,
            permits=snap.limit,
            in_use=snap.in_use,
            queued=snap.queued,
            engine_running=engine.running,
            completed=self.tally.completed,
            fallbacks=self.tally.fallbacks,
            p50_ttft_s=self.tally.p50_ttft_s(self.phase),
            kv_usage=engine.kv_usage,
        )

    def show(self, sample: Sample, *, always: bool = False) -> None:
        """Keep every sample; print one every LINE_S seconds, and whenever the permits move."""
        previous = self.samples[-1] if self.samples else None
        self.samples.append(sample)
        if previous is not None and previous.permits != sample.permits:
            figures = plan_figures(self.server)
            self.write(permits_changed(previous.permits, figures, self.gpu.neighbour_bytes) + "\n")
            always = True
        due = self._printed_at is None or sample.t_s - self._printed_at >= LINE_S - SAMPLE_S / 2
        if due or always:
            self._printed_at = sample.t_s
            self.write(format_line(sample, progress(sample.t_s, self.duration_s)) + "\n")

    def summary(self, plan: tuple[Phase, ...]) -> Summary:
        """The run per phase."""
        by_phase = {name: dict(counts) for name, counts in self.tally.by_phase.items()}
        names = [phase.name for phase in plan]
        outcomes = dict(self.tally.outcomes)
        return summarize(self.samples, names, outcomes, by_phase, self.tally.p50_ttft_s())

    def result(self, phase: str, label: str) -> RunResult:
        """One phase as a column of the comparison (engine counters over the whole run)."""
        peaks = [gauges for name, gauges in self.gauges if name == phase]
        return result_of(label, self.tally, phase, peaks, self.gauges[-1][1])


async def drive(run: Run, plan: tuple[Phase, ...], request: Request) -> None:
    """Run the load while the dashboard watches; stop watching once every client is done."""
    async with (
        aiohttp.ClientSession() as session,
        client_for(f"http://127.0.0.1:{run.server.proxy_port}/v1") as client,
    ):
        run.started = run.clock()
        watcher = asyncio.create_task(
            watch(lambda: run.take(session), run.show, SAMPLE_S), name="demo-dashboard"
        )
        try:
            await Load(client, request, run.tally, clock=run.clock).run(plan, run.enter)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        crash = None if watcher.cancelled() else watcher.exception()
        if crash is not None:  # a dashboard that died must not pass for a quiet run
            raise crash
        run.show(await run.take(session), always=True)
