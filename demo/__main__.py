"""``python -m demo``: the same overload through the sidecar and straight at the engine, twice.

No GPU and no engine needed. A simulated card sizes an emulated engine's KV cache; streaming
clients (the openai SDK) overload it, once through the real sidecar (its defaults but for
CHANGED_SETTINGS, each with its reason in docs/demo.md) and once straight at it, for a paged
engine that preempts (like vLLM) and one that fails its streams when the KV cache runs out. A
table and a picture put each pair side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from demo.compare import OBJECTIVES, RunResult, format_comparison, verdict_oom, verdict_paged
from demo.dashboard import HEADER, legend
from demo.load import Phase, Request
from demo.plot import write_comparison
from demo.run import Run, drive, start_engine
from demo.simulated_gpu import GIB, GpuLayout, SimulatedGpu
from demo.story import PATH_HINT, Workload, intro
from emulator.config import ENGINES, EmulatorConfig
from sidecar.entry.app import SidecarServer
from sidecar.entry.logs import configure_logging
from sidecar.entry.settings import Settings, load_settings

# Gemma 2 9B keeps 336 KiB of KV per token (42 layers x 8 KV heads x 256 x 2 B x 2), so a 24 GiB
# card holds ~15k tokens of KV: ~50 streams, which 2 cores can relay in real time.
MODEL = "gemma-2-9b"
BYTES_PER_TOKEN = 344_064
BLOCK_TOKENS = 16
WEIGHTS = 18_483_411_968  # google/gemma-2-9b's safetensors (the preset's figure)
CARD, ENGINE_OVERHEAD, DRIVER = 24 * GIB, 3 * GIB // 2, GIB // 2
PROMPT_WORDS, MAX_TOKENS, MEDIAN_RATIO, SEED = 200, 512, 0.1, 29
# A 24 GiB card of the RTX 4090 class: 40 tokens/s per stream, ~10k prompt tokens/s of compute.
TOKENS_PER_S, PREFILL_TOKENS_PER_S = 40.0, 10_000.0
PROMPT_BUDGET, COMPLETION_BUDGET = 1024, MAX_TOKENS
CLIENTS, DURATION_S = 160, 10.0
REQUEST = Request(MODEL, MAX_TOKENS, prompt="kv " * PROMPT_WORDS)
# Every sidecar setting the demo changes from its default, besides SIDECAR_UPSTREAM_URL (the
# emulated engine's free port): docs/demo.md gives each one's reason, and a test holds the page
# and this table to each other.
CHANGED_SETTINGS = {
    "SIDECAR_HOST": "127.0.0.1",
    "SIDECAR_ADMIN_HOST": "127.0.0.1",
    "SIDECAR_PORT": "0",
    "SIDECAR_ADMIN_PORT": "0",
    "SIDECAR_MODEL": MODEL,
    "SIDECAR_WEIGHTS": str(WEIGHTS),
    "SIDECAR_OVERHEAD": str(ENGINE_OVERHEAD),
    "SIDECAR_MAX_PROMPT_TOKENS": str(PROMPT_BUDGET),
    "SIDECAR_MAX_COMPLETION_TOKENS": str(COMPLETION_BUDGET),
    "SIDECAR_REFRESH_MS": "250",
    "SIDECAR_MAX_QUEUE": "8",
    "SIDECAR_MAX_WAIT_MS": "1500",
    "SIDECAR_LOG_LEVEL": "warning",
}
# The one sidecar setting a user may pass through to compare a mode.
PASSED_THROUGH = ("SIDECAR_ADMISSION",)


@dataclass(frozen=True)
class DemoResult:
    """What the demo showed: the four runs (paged: ours, bare; OOM: ours, bare), the picture."""

    results: tuple[RunResult, ...]
    mode: str
    picture: Path


def gpu_layout() -> GpuLayout:
    """The card: weights, the engine's overhead, the driver's share, the rest KV in blocks."""
    block_bytes = BLOCK_TOKENS * BYTES_PER_TOKEN
    pool = (CARD - WEIGHTS - ENGINE_OVERHEAD - DRIVER) // block_bytes * block_bytes
    return GpuLayout(CARD, WEIGHTS, ENGINE_OVERHEAD, DRIVER, pool, name="Simulated GPU 24GB")


def engine_config(layout: GpuLayout, *, oom: bool = False, engine: str = "vllm") -> EmulatorConfig:
    """The emulated engine speaking ``engine``'s metrics, sized to the simulated card's KV pool,
    with the demo's seed."""
    return EmulatorConfig(
        engine=engine,
        model_name=MODEL,
        max_model_len=8192,
        kv_tokens=layout.kv_pool_bytes // BYTES_PER_TOKEN,
        block_size=BLOCK_TOKENS,
        max_num_seqs=256,
        tokens_per_s=TOKENS_PER_S,
        prefill_tokens_per_s=PREFILL_TOKENS_PER_S,
        bytes_per_token=BYTES_PER_TOKEN,
        oom=oom,
        completion_median_ratio=MEDIAN_RATIO,
        completion_sigma=0.8,
        seed=SEED,
    )


def sidecar_settings(engine_url: str, environ: Mapping[str, str] = os.environ) -> Settings:
    """The real sidecar as a user would start it next to the engine: its defaults but for
    CHANGED_SETTINGS and the engine's URL, and SIDECAR_ADMISSION if the environment names one."""
    env = {**CHANGED_SETTINGS, "SIDECAR_UPSTREAM_URL": engine_url}
    env.update({name: environ[name] for name in PASSED_THROUGH if name in environ})
    return load_settings(env)


def workload(layout: GpuLayout, clients: int, duration_s: float) -> Workload:
    """The figures the intro quotes."""
    return Workload(
        MODEL,
        clients,
        duration_s,
        PROMPT_WORDS,
        MAX_TOKENS,
        MEDIAN_RATIO,
        engine_config(layout).kv_cache_size_tokens,
        TOKENS_PER_S,
        PREFILL_TOKENS_PER_S,
    )


async def one_run(
    config: EmulatorConfig,
    phase: Phase,
    label: str,
    write: Callable[[str], object],
    *,
    clock: Callable[[], float],
    gpu: SimulatedGpu | None,
) -> RunResult:
    """One run on a fresh engine; through a fresh sidecar when ``gpu`` is given."""
    write(f"\n--- {label}: {phase.clients} clients for {phase.duration_s:.0f} s\n{HEADER}\n")
    engine, url = await start_engine(config)
    try:
        if gpu is None:
            run = Run(label, url, write, clock, phase.duration_s)
            await drive(run, phase, REQUEST)
            return run.result(phase.name)
        server = SidecarServer(sidecar_settings(url), clock=clock, gpu_probe=gpu)
        await server.start()
        try:
            run = Run(label, url, write, clock, phase.duration_s, sidecar=server)
            await drive(run, phase, REQUEST)
            await server.drain(5.0)
        finally:
            await server.stop()
        return run.result(phase.name)
    finally:
        await engine.cleanup()


async def run_demo(
    duration_s: float = DURATION_S,
    clients: int = CLIENTS,
    write: Callable[[str], object] = sys.stdout.write,
    clock: Callable[[], float] = time.monotonic,
    picture: Path | None = None,
    *,
    engine_name: str = "vllm",
) -> DemoResult:
    """The four runs, the table, the verdict and the picture, in front of the emulated engine
    speaking ``engine_name``'s metrics (llama.cpp never preempts: its runs are the OOM pair)."""
    layout = gpu_layout()
    settings = sidecar_settings("http://127.0.0.1:1")
    mode = settings.admission
    story = intro(layout, workload(layout, clients, duration_s), mode, engine_name)
    write("\n".join(story) + "\n\n")
    write("\n".join(legend(settings.max_queue, settings.max_wait_ms / 1000)) + "\n")
    phase = Phase("overload", duration_s, clients)
    results = []
    for oom, engine in _engines(engine_name):
        config = engine_config(layout, oom=oom, engine=engine_name)
        gpu = SimulatedGpu(layout, clock=clock)
        ours = f"{engine} + sidecar"
        results.append(await one_run(config, phase, ours, write, clock=clock, gpu=gpu))
        bare = f"{engine}, bare"
        results.append(await one_run(config, phase, bare, write, clock=clock, gpu=None))
    lines = [
        "",
        *format_comparison(results),
        "",
        f"SLO goodput: completion tokens/s of the streams whose first token came within "
        f"{OBJECTIVES.ttft_s:g} s of sending and whose",
        f"tokens then came {OBJECTIVES.tpot_s * 1000:g} ms apart or less on average; a busy "
        "answer or a failed stream is a miss.",
        "",
    ]
    for (_, engine), with_sidecar, alone in zip(
        _engines(engine_name), results[::2], results[1::2], strict=True
    ):
        verdict = verdict_oom if engine == "OOM" else verdict_paged
        lines += verdict(with_sidecar, alone)
    write("\n".join(lines) + "\n")
    title = (
        f"python -m demo --duration {duration_s:g} --clients {clients}: the sidecar "
        f"(admission {mode}) against the bare engine, same load"
    )
    path = write_comparison(results, picture or _picture_path(), title)
    write(f"\npicture: {path}\n{PATH_HINT}\n")
    return DemoResult(tuple(results), mode, path)


def _engines(engine_name: str) -> tuple[tuple[bool, str], ...]:
    if engine_name == "llamacpp":  # llama.cpp fails streams when its pool runs dry
        return ((True, "OOM"),)
    return ((False, "paged"), (True, "OOM"))


def _picture_path() -> Path:
    return Path(tempfile.gettempdir()) / "sidecar-demo-timeline.png"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, run the demo, exit 0."""
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__)
    parser.add_argument(
        "--duration", type=float, default=DURATION_S, help=f"seconds per run ({DURATION_S:.0f})"
    )
    parser.add_argument("--clients", type=int, default=CLIENTS, help=f"clients ({CLIENTS})")
    parser.add_argument("--picture", type=Path, default=None, help="where to write the PNG")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="whose metrics the emulated engine speaks (vllm)",
    )
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.clients < 1:
        parser.error("--duration must be positive and --clients at least 1")
    configure_logging("error", sys.stderr)  # the OOM engine logs every stream it fails
    asyncio.run(
        run_demo(args.duration, args.clients, picture=args.picture, engine_name=args.engine)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
