"""`make bench-overload`: the sidecar against vLLM's own options, on a real vLLM under overload.

One run, side by side: vLLM alone, vLLM with `--max-num-queued-reqs` and with
`--max-num-queued-tokens`, and `sidecar serve` in front of the plain engine in its default
admission and in each mode. Every configuration meets the same loads (closed-loop clients, and
Poisson arrivals at 1.5x and 3x what the engine alone completes), with short and long prompts.
Printed: a table per load and the issue's targets as PASS/MISS; written: .bench/overload.json and
.bench/overload.png (KV usage over time and goodput).

    OVERLOAD_MEASURE_S   seconds measured per run (default 30, after OVERLOAD_WARMUP_S=10)
    OVERLOAD_LOADS       e.g. closed-short,open3x-long (default: all six)
    OVERLOAD_CONFIGS     e.g. vllm,vllm-queued-reqs,sidecar (default: all)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.overload import servers
from benchmarks.overload.engine_watch import Timeline, watch
from benchmarks.overload.load import (
    LONG_WORDS,
    SHORT_WORDS,
    Load,
    Tally,
    Window,
    closed_loop,
    open_loop,
)
from benchmarks.overload.report import Row, print_table, print_targets, write_plot

OUT = Path(".bench")
WARMUP_S = float(os.environ.get("OVERLOAD_WARMUP_S", "10"))
MEASURE_S = float(os.environ.get("OVERLOAD_MEASURE_S", "30"))
CLIENTS = 96
QUEUED_REQS = 32
QUEUED_TOKENS = 2048
PROMPTS = {"short": SHORT_WORDS, "long": LONG_WORDS}
LOAD_NAMES = ("closed", "open1.5x", "open3x")


@dataclass(frozen=True, slots=True)
class Config:
    """What stands in front of the engine, and the engine's own flags."""

    name: str
    engine_flags: tuple[str, ...] = ()
    sidecar_mode: str | None = None
    behind_sidecar: bool = False


CONFIGS = (
    Config("vllm"),
    Config("vllm-queued-reqs", ("--max-num-queued-reqs", str(QUEUED_REQS))),
    Config("vllm-queued-tokens", ("--max-num-queued-tokens", str(QUEUED_TOKENS))),
    Config("sidecar", behind_sidecar=True),
    Config("sidecar-count", sidecar_mode="count", behind_sidecar=True),
    Config("sidecar-tokens", sidecar_mode="tokens", behind_sidecar=True),
)
# The sidecar's only settings: the budget the load asks for, and how many bytes the tiny model's
# tokenizer makes a token (2, where real tokenizers make about 4: the default); the rest are its
# defaults.
SIDECAR_SETTINGS = {
    "max_prompt_tokens": "1000",
    "max_completion_tokens": "1024",
    "prompt_bytes_per_token": "2",
}


def wanted(env: str, names: tuple[str, ...]) -> tuple[str, ...]:
    chosen = os.environ.get(env)
    return names if not chosen else tuple(n for n in names if n in chosen.split(","))


async def run_load(url: str, engine_url: str, load: Load) -> tuple[Tally, Timeline, Window]:
    """One load against ``url`` for warm-up plus measurement; the engine watched meanwhile."""
    now = time.monotonic()
    window = Window(now + WARMUP_S, now + WARMUP_S + MEASURE_S)
    tally, timeline = Tally(), Timeline()
    drive = closed_loop if load.clients else open_loop
    clients = asyncio.create_task(drive(url, load, servers.SERVED_MODEL, window, tally))
    await watch(engine_url + "/metrics", timeline, window.end)
    clients.cancel()
    await asyncio.gather(clients, return_exceptions=True)
    return tally, timeline, window


async def settle(engine_url: str) -> None:
    """Wait until the engine has nothing running or waiting (aborted streams leave quickly)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        timeline = Timeline()
        await watch(engine_url + "/metrics", timeline, time.monotonic() + 0.1)
        if timeline.samples and not (timeline.samples[-1].running or timeline.samples[-1].waiting):
            return
        await asyncio.sleep(0.5)


def load_for(name: str, prompt: str, engine_rate: dict[str, float]) -> Load:
    if name == "closed":
        return Load(f"closed-{prompt}", PROMPTS[prompt], clients=CLIENTS)
    factor = float(name.removeprefix("open").removesuffix("x"))
    return Load(f"{name}-{prompt}", PROMPTS[prompt], rate=factor * engine_rate[prompt])


async def measure(config: Config, url: str, engine_url: str, load: Load) -> Row:
    await settle(engine_url)
    tally, timeline, window = await run_load(url, engine_url, load)
    row = Row.of(config.name, load.name, tally, timeline, window)
    print(row.line(), flush=True)
    return row


async def main_async() -> list[Row]:
    loads = wanted("OVERLOAD_LOADS", tuple(f"{n}-{p}" for n in LOAD_NAMES for p in PROMPTS))
    configs = [
        c for c in CONFIGS if c.name in wanted("OVERLOAD_CONFIGS", tuple(c.name for c in CONFIGS))
    ]
    rows: list[Row] = []
    engine_rate: dict[str, float] = {}
    for flags in dict.fromkeys(c.engine_flags for c in configs):
        with servers.vllm(flags, OUT / "overload-vllm.log") as engine_url:
            for config in (c for c in configs if c.engine_flags == flags):
                rows += await run_config(config, engine_url, loads, engine_rate)
    return rows


async def run_config(
    config: Config, engine_url: str, loads: tuple[str, ...], engine_rate: dict[str, float]
) -> list[Row]:
    """Every load on one configuration; the first closed loops set the open-loop rates."""
    rows: list[Row] = []
    for name in loads:
        kind, prompt = name.rsplit("-", 1)
        if kind != "closed" and prompt not in engine_rate:
            engine_rate[prompt] = await calibrate(engine_url, prompt)
        load = load_for(kind, prompt, engine_rate)
        if config.behind_sidecar:
            log = OUT / f"overload-{config.name}.log"
            with servers.sidecar(engine_url, config.sidecar_mode, log, **SIDECAR_SETTINGS) as url:
                rows.append(await measure(config, url, engine_url, load))
        else:
            rows.append(await measure(config, engine_url, engine_url, load))
        if kind == "closed" and prompt not in engine_rate and config.name == "vllm":
            engine_rate[prompt] = rows[-1].completed / MEASURE_S
    return rows


async def calibrate(engine_url: str, prompt: str) -> float:
    """Completions per second of the engine alone under the closed loop (when not yet run)."""
    await settle(engine_url)
    tally, _timeline, _window = await run_load(
        engine_url, engine_url, load_for("closed", prompt, {})
    )
    return tally.completed / MEASURE_S


def main() -> int:
    OUT.mkdir(exist_ok=True)
    rows = asyncio.run(main_async())
    print_table(rows)
    passed = print_targets(rows)
    (OUT / "overload.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    write_plot(rows, OUT / "overload.png")
    print(f"wrote {OUT / 'overload.json'} and {OUT / 'overload.png'}")
    return 0 if passed or os.environ.get("OVERLOAD_STRICT") != "1" else 1


if __name__ == "__main__":
    sys.exit(main())
