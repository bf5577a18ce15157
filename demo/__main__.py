"""``python -m demo``: a simulated GPU, the emulated engine, the real sidecar between them, load.

No GPU and no engine needed. The sidecar sizes its permits through its real NVML path from the
simulated card, the engine's KV pool is exactly what that card leaves for it, and streaming
clients (the openai SDK) show admissions, queueing and busy answers, then a noisy neighbour;
then the same burst straight at the engine, without the sidecar, for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from demo.dashboard import HEADER, LEGEND, Summary, format_summary
from demo.direct import RunResult, burst_direct, format_comparison, start_engine
from demo.load import FALLBACK_CODES, Phase, Request
from demo.plot import write_timeline
from demo.run import Run, drive, plan_figures
from demo.simulated_gpu import GIB, GpuLayout, SimulatedGpu
from demo.story import PATH_HINT, intro
from emulator.config import ENGINES, EmulatorConfig
from sidecar.entry.app import SidecarServer
from sidecar.entry.logs import configure_logging
from sidecar.entry.settings import Settings, load_settings

MODEL = "qwen2.5-7b"
BYTES_PER_TOKEN = 57_344  # qwen2.5-7b, fp16 KV: 2 x 28 layers x 4 KV heads x 128 x 2 bytes
BLOCK_TOKENS = 16
PROMPT_BUDGET, COMPLETION_BUDGET = 6000, 2000  # 8,000 tokens = 458,752,000 B per request
WEIGHTS = 15_231_233_024  # Qwen2.5-7B's bf16 safetensors
NEIGHBOUR = 4 * GIB
# Each client sends a 5,000-word prompt (5,007 tokens with the chat template) for 64 tokens.
PROMPT_WORDS, MAX_TOKENS, TOKENS_PER_S, TTFT_S = 5000, 64, 60.0, 0.1
REQUEST = Request(MODEL, MAX_TOKENS, prompt="kv " * PROMPT_WORDS)
STREAM_S = TTFT_S + MAX_TOKENS / TOKENS_PER_S + 0.2  # one stream, with some slack
BURST_FACTOR = 10
# Phase lengths as shares of --duration.
SHARES = {"steady": 0.2, "burst": 0.3, "noisy neighbour": 0.3, "neighbour gone": 0.2}


CAVEAT = (
    "",
    "Read the columns together: straight at the engine, more streams finish here because the",
    "emulated engine has no compute limit, but their first tokens come seconds late (the paged",
    "engine) or they die with the engine's memory (the OOM engine). The sidecar keeps TTFT",
    "short and says 'busy' to the rest. It prices each request at its worst case (8,000",
    "tokens; these use 5,071), so half the KV cache stays free: docs/adaptive.md prices",
    "requests by what they really use.",
)


@dataclass(frozen=True)
class DemoResult:
    """What the run showed: the sidecar's run, the burst compared, where the picture is."""

    summary: Summary
    comparison: tuple[RunResult, ...]
    picture: Path | None


def gpu_layout() -> GpuLayout:
    """A 24 GiB card: weights, 1.5 GiB engine overhead, 0.5 GiB driver, the rest KV in blocks."""
    total, overhead, driver = 24 * GIB, 3 * GIB // 2, GIB // 2
    block_bytes = BLOCK_TOKENS * BYTES_PER_TOKEN
    pool = (total - WEIGHTS - overhead - driver) // block_bytes * block_bytes
    return GpuLayout(total, WEIGHTS, overhead, driver, pool)


def engine_config(layout: GpuLayout, *, oom: bool = False, engine: str = "vllm") -> EmulatorConfig:
    """The emulated engine, sized to the simulated card's KV pool; a stream lasts ~1.2 s."""
    return EmulatorConfig(
        engine=engine,
        model_name=MODEL,
        max_model_len=8192,
        kv_tokens=layout.kv_pool_bytes // BYTES_PER_TOKEN,
        block_size=BLOCK_TOKENS,
        max_num_seqs=256,
        tokens_per_s=TOKENS_PER_S,
        ttft_s=TTFT_S,
        bytes_per_token=BYTES_PER_TOKEN,
        oom=oom,
    )


def sidecar_settings(engine_url: str) -> Settings:
    """The real sidecar, planning from NVML readings (the simulated card) every 250 ms."""
    env = {
        "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_ADMIN_HOST": "127.0.0.1",
        "SIDECAR_PORT": "0",
        "SIDECAR_ADMIN_PORT": "0",
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
    return load_settings(env)


def phases(duration_s: float, permits: int, burst_clients: int | None) -> tuple[Phase, ...]:
    """Under capacity, ten times capacity, a neighbour taking memory, the neighbour gone."""
    burst = burst_clients if burst_clients is not None else BURST_FACTOR * permits
    steady = max(1, permits // 2)
    return (
        # Steady ends quiet so none of its streams meets the burst.
        Phase("steady", SHARES["steady"] * duration_s, steady, think_s=0.3, settle_s=STREAM_S),
        Phase("burst", SHARES["burst"] * duration_s, burst),
        Phase("noisy neighbour", SHARES["noisy neighbour"] * duration_s, permits, NEIGHBOUR),
        Phase("neighbour gone", SHARES["neighbour gone"] * duration_s, permits),
    )


async def run_demo(
    duration_s: float = 20.0,
    clients: int | None = None,
    write: Callable[[str], object] = sys.stdout.write,
    clock: Callable[[], float] = time.monotonic,
    picture: Path | None = None,
    *,
    engine_name: str = "vllm",
) -> DemoResult:
    """The whole demo, in front of the emulated engine speaking ``engine_name``'s metrics;
    returns what it showed after everything has stopped."""
    layout = gpu_layout()
    gpu = SimulatedGpu(layout, clock=clock)
    engine, engine_url = await start_engine(engine_config(layout, engine=engine_name))
    try:
        server = SidecarServer(sidecar_settings(engine_url), clock=clock, gpu_probe=gpu)
        await server.start()
        try:
            figures = plan_figures(server)
            write("\n".join(intro(layout, figures, MODEL, duration_s)) + "\n\n")
            write("\n".join(LEGEND) + "\n\n" + HEADER + "\n")
            run = Run(server, gpu, engine_url, write, clock=clock, duration_s=duration_s)
            plan = phases(duration_s, figures.permits, clients)
            await drive(run, plan, REQUEST)
            await server.drain(5.0)
        finally:
            await server.stop()
    finally:
        await engine.cleanup()
    summary = run.summary(plan)
    write("\n" + "\n".join(format_summary(summary)) + "\n")
    comparison = (
        run.result("burst", "with sidecar"),
        *await _without(layout, plan[1], write, engine_name),
    )
    write("\n" + "\n".join([*format_comparison(comparison, FALLBACK_CODES), *CAVEAT]) + "\n")
    path = write_timeline(run.samples, picture or _picture_path(), "python -m demo: the sidecar")
    write(f"\ntimeline: {path}\n{PATH_HINT}\n")
    return DemoResult(summary, comparison, path)


async def _without(
    layout: GpuLayout, burst: Phase, write: Callable[[str], object], engine_name: str
) -> tuple[RunResult, ...]:
    results = []
    engines: tuple[tuple[bool, str, str], ...] = (
        (False, "paged engine", "pages and preempts when its KV cache is full, like vLLM"),
        (True, "OOM engine", "fails its running streams when its KV cache runs out"),
    )
    if engine_name == "llamacpp":  # llama.cpp never preempts: only the failing engine is real
        engines = ((True, "llama.cpp", "fails its streams when its shared KV pool runs out"),)
    for oom, label, how in engines:
        write(
            f"\n--- without the sidecar: the same {burst.clients} clients for "
            f"{burst.duration_s:.1f} s straight at an engine that {how} ...\n"
        )
        config = engine_config(layout, oom=oom, engine=engine_name)
        results.append(await burst_direct(config, burst, REQUEST, label))
    return tuple(results)


def _picture_path() -> Path:
    return Path(tempfile.gettempdir()) / "sidecar-demo-timeline.png"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, run the demo, exit 0."""
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument(
        "--duration", type=float, default=20.0, help="seconds with the sidecar (20)"
    )
    parser.add_argument("--clients", type=int, default=None, help="burst clients (10 x permits)")
    parser.add_argument("--picture", type=Path, default=None, help="where to write the PNG")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="whose metrics the emulated engine speaks (vllm)",
    )
    args = parser.parse_args(argv)
    if args.duration <= 0 or (args.clients is not None and args.clients < 1):
        parser.error("--duration must be positive and --clients at least 1")
    configure_logging("error", sys.stderr)  # the OOM engine logs every stream it fails
    asyncio.run(
        run_demo(args.duration, args.clients, picture=args.picture, engine_name=args.engine)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
