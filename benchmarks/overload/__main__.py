"""`make bench-overload`: SLO goodput under overload, the sidecar against the engine's own caps.

One run, side by side and interleaved: vLLM alone, vLLM `--max-num-queued-reqs 32` and `sidecar
serve` at its defaults in front of the plain engine, on three loads of a real vLLM (CPU, its
compute pinned to core 0) and one GPU-shaped load of the emulated engine, and on each closed
load the engine alone at fewer clients for its best operating point; every load and
configuration once per repetition, the median of the repetitions reported. Printed: a table per
load and the targets, yes or NO; written: .bench/overload.json (every request's record and a
summary), .bench/overload.md and .bench/overload.png.

    OVERLOAD_MEASURE_S      seconds measured per run (default 40, after OVERLOAD_WARMUP_S=10,
                            or the load's own longer warm-up: gpu-long's 40 s)
    OVERLOAD_REPETITIONS    default 3
    OVERLOAD_LOADS          closed-short,closed-long,open-long,gpu-long (default: all)
    OVERLOAD_CONFIGS        alone,queued-reqs,queued-tokens,sidecar,sidecar-b (default: all
                            but queued-tokens and sidecar-b)
    OVERLOAD_SIDECAR_B      sidecar-b's own SIDECAR_* settings, key=value,... (e.g.
                            slo_law=queue): two sidecars compared in the same run
    OVERLOAD_SIDECAR_B_PROGRAM  sidecar-b's program (default: this checkout's): another build's
                            `sidecar`, e.g. main's, to compare two builds in the same run
    OVERLOAD_SIDECAR_LOG_LEVEL  the sidecars' SIDECAR_LOG_LEVEL (default warning; debug shows
                            each step of the SLO law in .bench/overload-<config>-<engine>.log)
    OVERLOAD_OPEN_RATE      open-long's arrivals per second (default: 1.5x vLLM alone's
                            completions per second under closed-long, first repetition)
    OVERLOAD_SLO_TTFT_MS, OVERLOAD_SLO_TPOT_MS   the objectives, passed to the sidecar too
                            (default: the sidecar's, 2000 and 100)
    OVERLOAD_SWEEP          the engine's best operating point: client counts at which each
                            repetition also runs the engine alone on each closed load (default
                            24,36,48; none: no sweep). The best SLO goodput of these and of
                            `alone` (96) is the point the sidecar is judged against (>= 0.9x);
                            an open loop has no client count, and no sweep
    OVERLOAD_SIDECAR_QUOTA  each sidecar in a cgroup (v1 cpu controller) of its own, under a CPU
                            quota of this many cores (e.g. 1; default: none)
    OVERLOAD_NEIGHBOUR      1: a busy neighbour process spinning in the sidecar's cgroup for the
                            run (default 0). Both need a writable /sys/fs/cgroup/cpu (root):
                            without one the run stops at the start, exit 2
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.overload import servers
from benchmarks.overload.cpu_quota import (
    CPU_ROOT,
    CpuGroup,
    SidecarCpu,
    check_writable,
    cpu_group,
    sidecar_cpu,
)
from benchmarks.overload.engine_watch import Timeline, watch
from benchmarks.overload.load import Load, Tally, Window, closed_loop, open_loop
from benchmarks.overload.plan import (
    ALONE,
    CONFIGS,
    DEFAULT_CONFIGS,
    GPU_ENGINE_FLAGS,
    LOADS,
    OPEN_FACTOR,
    SIDECAR_SETTINGS,
    Config,
    LoadSpec,
    SettingError,
    chosen,
    schedule,
    sweep,
)
from benchmarks.overload.plot import write_plot
from benchmarks.overload.report import markdown, print_report, summary
from benchmarks.overload.targets import Report, run_figures
from demo.slo import Objectives, Record
from sidecar.entry.settings import Settings

OUT = Path(".bench")
RECORDS = OUT / "overload.json"
WARMUP_S = float(os.environ.get("OVERLOAD_WARMUP_S", "10"))
MEASURE_S = float(os.environ.get("OVERLOAD_MEASURE_S", "40"))
REPETITIONS = int(os.environ.get("OVERLOAD_REPETITIONS", "3"))
# The sidecar's default objectives, unless OVERLOAD_SLO_* set others: then the sidecar is told them.
SLO_SETTINGS = {
    name: os.environ[f"OVERLOAD_{name.upper()}"]
    for name in ("slo_ttft_ms", "slo_tpot_ms")
    if os.environ.get(f"OVERLOAD_{name.upper()}")
}
OBJECTIVES = Objectives(
    ttft_s=float(SLO_SETTINGS.get("slo_ttft_ms", Settings.model_fields["slo_ttft_ms"].default))
    / 1000,
    tpot_s=float(SLO_SETTINGS.get("slo_tpot_ms", Settings.model_fields["slo_tpot_ms"].default))
    / 1000,
)


async def run_load(
    url: str, engine_url: str, load: Load, model: str, warmup_s: float
) -> dict[str, Any]:
    """One load against ``url`` for ``warmup_s`` plus measurement, the engine watched meanwhile;
    the records and samples with times in seconds into the measurement window."""
    now = time.monotonic()
    window = Window(now + warmup_s, now + warmup_s + MEASURE_S)
    tally, timeline = Tally(), Timeline()
    drive = closed_loop if load.clients else open_loop
    clients = asyncio.create_task(drive(url, load, model, window, tally))
    await watch(engine_url + "/metrics", timeline, window.end)
    clients.cancel()
    await asyncio.gather(clients, return_exceptions=True)
    start = window.start
    return {
        "window_s": MEASURE_S,
        "warmup_s": warmup_s,
        "offered_rate": load.rate or None,
        "sent": [round(t - start, 4) for t in tally.sent],
        "records": [_row(r, start) for r in tally.records],
        "engine_samples": [
            [round(s.at - start, 3), s.kv_usage, s.running, s.waiting, s.preemptions]
            for s in timeline.samples
        ],
    }


def _row(record: Record, start: float) -> list[object]:
    """A record as the JSON keeps it (``Record``'s fields), times into the window."""
    ttft = None if record.ttft_s is None else round(record.ttft_s, 4)
    sent, ended = round(record.sent_at - start, 4), round(record.ended_at - start, 4)
    return [record.ending, sent, ended, ttft, record.tokens, record.retry_after_s, record.detail]


async def settle(engine_url: str) -> None:
    """Wait until the engine has nothing running or waiting (aborted streams leave quickly)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        timeline = Timeline()
        await watch(engine_url + "/metrics", timeline, time.monotonic() + 0.1)
        if timeline.samples and not (timeline.samples[-1].running or timeline.samples[-1].waiting):
            return
        await asyncio.sleep(0.5)


class Engines:
    """Every engine the run needs, started once: one per (engine, flags); all idle but one."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack = stack
        self._urls: dict[tuple[str, tuple[str, ...]], str] = {}

    def url(self, engine: str, flags: tuple[str, ...]) -> str:
        key = (engine, flags)
        if key not in self._urls:
            slug = "-".join([engine, *flags]).replace("--", "").strip("-")
            log = OUT / f"overload-{slug}.log"
            print(f"starting {engine} {' '.join(flags)}", flush=True)
            if engine == "vllm":
                started = servers.vllm(flags, log)
            else:
                started = servers.emulator((*GPU_ENGINE_FLAGS, *flags), log)
            self._urls[key] = self._stack.enter_context(started)
        return self._urls[key]


async def measure(
    engines: Engines, spec: LoadSpec, config: Config, rate: float, rep: int, *, cpu: SidecarCpu
) -> dict[str, Any]:
    engine_url = engines.url(spec.engine, config.engine_flags(spec.engine))
    await settle(engine_url)
    load = spec.load(rate, config.clients)
    warmup_s = max(WARMUP_S, spec.warmup_s)
    if config.behind_sidecar:
        run = await behind_sidecar(engine_url, spec, config, load, warmup_s=warmup_s, cpu=cpu)
    else:
        run = await run_load(engine_url, engine_url, load, spec.model, warmup_s)
    run |= {
        "rep": rep,
        "load": spec.name,
        "config": config.name,
        "engine": spec.engine,
        "label": config.label(spec.engine),
        "clients": load.clients or None,
        "sweep": config.clients is not None,
    }
    print(progress_line(run), flush=True)
    return run


async def behind_sidecar(
    engine_url: str,
    spec: LoadSpec,
    config: Config,
    load: Load,
    *,
    warmup_s: float,
    cpu: SidecarCpu,
) -> dict[str, Any]:
    """The load through a sidecar in front of the engine, in a cgroup of its own where ``cpu``
    asks for one (its usage kept in the run as ``cpu_group``)."""
    log = OUT / f"overload-{config.name}-{spec.engine}.log"
    settings = SIDECAR_SETTINGS[spec.engine] | SLO_SETTINGS | dict(config.settings)
    with contextlib.ExitStack() as stack:
        group: CpuGroup | None = None
        if cpu.held:
            group = stack.enter_context(cpu_group(cpu, config.name))
        prefix = group.prefix() if group else ()
        sidecar = servers.sidecar(engine_url, None, log, config.program, prefix=prefix, **settings)
        url = stack.enter_context(sidecar)
        before = group.usage() if group else {}
        run = await run_load(url, engine_url, load, spec.model, warmup_s)
        if group:
            run["cpu_group"] = {key: value - before[key] for key, value in group.usage().items()}
    return run


def progress_line(run: dict[str, Any]) -> str:
    f = run_figures(run, OBJECTIVES)
    return (
        f"rep {run['rep'] + 1} {run['load']:<12}  {run['label']:<34} offered {f.offered_per_s:5.1f}"
        f" req/s  SLO {f.slo_goodput:7,.0f}  raw {f.raw:7,.0f} tok/s  met {f.met:.0f}/"
        f"{f.completed:.0f}  TTFT p99 {f.ttft_p99_s:5.2f} s  busy {f.busy:.0f}"
        + _throttled(run.get("cpu_group"))
    )


def _throttled(usage: dict[str, float] | None) -> str:
    """The sidecar's cgroup over the run, for the progress line."""
    if usage is None:
        return ""
    return f"  throttled {usage['nr_throttled']:.0f}/{usage['nr_periods']:.0f} periods"


def completions_per_s(run: dict[str, Any]) -> float:
    """Requests completed per second inside the run's window."""
    span = float(run["window_s"])
    ended = [float(r[2]) for r in run["records"] if r[0] == "completed"]
    return sum(0 <= t < span for t in ended) / span


def open_rate(runs: list[dict[str, Any]]) -> float:
    """OVERLOAD_OPEN_RATE, else OPEN_FACTOR x vLLM alone's completions per second in its first
    closed-long run."""
    fixed = os.environ.get("OVERLOAD_OPEN_RATE")
    if fixed:
        return float(fixed)
    alone = next(r for r in runs if (r["load"], r["config"]) == ("closed-long", ALONE))
    return OPEN_FACTOR * completions_per_s(alone)


async def main_async(points: tuple[Config, ...], cpu: SidecarCpu) -> dict[str, Any]:
    """Every run of the plan, the sweep's ``points`` among the configurations, each sidecar
    where ``cpu`` says."""
    names = tuple(s.name for s in LOADS)
    loads = tuple(s for s in LOADS if s.name in chosen("OVERLOAD_LOADS", names, names))
    configs_chosen = chosen("OVERLOAD_CONFIGS", tuple(c.name for c in CONFIGS), DEFAULT_CONFIGS)
    configs = tuple(c for c in CONFIGS if c.name in configs_chosen) + points
    runs: list[dict[str, Any]] = []
    document = {
        "objectives": asdict(OBJECTIVES),
        "measure_s": MEASURE_S,
        "warmup_s": WARMUP_S,
        "repetitions": REPETITIONS,
        "commit": _commit(),
        "loads": {s.name: s.describe() for s in loads},
        "sweep": [c.clients for c in points],
        "sidecar_cpu": cpu.record() if cpu.held else None,
        "runs": runs,
    }
    with contextlib.ExitStack() as stack:
        engines = Engines(stack)
        plan = schedule(REPETITIONS, loads, configs)
        calibrated = any(
            (s.name, c.name) == ("closed-long", ALONE) for rep, s, c in plan if rep == 0
        )
        fixed_rate = bool(os.environ.get("OVERLOAD_OPEN_RATE"))
        if any(not s.closed for s in loads) and not calibrated and not fixed_rate:
            # The open load's rate comes from vLLM alone under closed-long: measure it first
            # (kept in the JSON as repetition -1, left out of the tables).
            closed_long = next(s for s in LOADS if s.name == "closed-long")
            runs.append(await measure(engines, closed_long, CONFIGS[0], 0.0, -1, cpu=cpu))
        for rep, spec, config in plan:
            rate = 0.0 if spec.closed else open_rate(runs)
            runs.append(await measure(engines, spec, config, rate, rep, cpu=cpu))
            # Written after every run: a run that stops half-way keeps what it measured
            # (`python -m benchmarks.overload.report .bench/overload.json` reads it).
            RECORDS.write_text(json.dumps(document))
    return document


def _commit() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, check=True, text=True
        )
        return out.stdout.strip()
    return "unknown"


def main(env: Mapping[str, str] = os.environ, cpu_root: Path = CPU_ROOT) -> int:
    """The run; 2, with one line naming the setting, where an OVERLOAD_* setting cannot be
    used (before anything starts)."""
    try:
        points, cpu = sweep(env), sidecar_cpu(env)
        if cpu.held:
            check_writable(cpu, cpu_root)
    except SettingError as exc:
        print(f"bench-overload: {exc}", file=sys.stderr)
        return 2
    OUT.mkdir(exist_ok=True)
    servers.pin_clients()
    started = time.monotonic()
    document = asyncio.run(main_async(points, cpu))
    report = Report(document)
    passed = print_report(report)
    RECORDS.write_text(json.dumps(document | {"summary": summary(report)}))
    (OUT / "overload.md").write_text(markdown(report))
    write_plot(report, OUT / "overload.png")
    minutes = (time.monotonic() - started) / 60
    print(f"\nwrote {OUT}/overload.json, overload.md and overload.png ({minutes:.0f} min)")
    return 0 if passed or os.environ.get("OVERLOAD_STRICT") != "1" else 1


if __name__ == "__main__":
    sys.exit(main())
