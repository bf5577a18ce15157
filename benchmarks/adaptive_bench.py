"""Goodput on a paged engine with heavy-tailed completions: no sidecar, count, tokens, adaptive.

The emulated engine (paged, preempting) ends completions early, lognormal with median max_tokens/10,
hidden from the sidecar; a closed loop of more clients than the pool holds keeps it full. Each mode
gets a fresh engine (same seed) and, except "none", a `sidecar serve` in front that knows nothing
but the engine's URL. Printed per mode: goodput (completion tokens/s of completed requests),
completed requests, engine preemptions per completed request, TTFT p50/p99, busy answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from benchmarks.overload.servers import free_port, stop

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SIDECAR = str(Path(PYTHON).with_name("sidecar"))
MODES = tuple(os.environ.get("ADAPTIVE_BENCH_MODES", "none,count,tokens,adaptive").split(","))
# Whose metrics the emulated engine speaks (vllm, sglang; llamacpp never preempts, so adaptive
# admission falls back to the worst case there), and the counter its preemptions are read from.
ENGINE = os.environ.get("ADAPTIVE_BENCH_ENGINE", "vllm")
PREEMPTION_COUNTER = {
    "vllm": "vllm:num_preemptions_total",
    "sglang": "sglang:num_retracted_requests_total",
    "llamacpp": "",  # none: requests fail instead
}[ENGINE]
CLIENTS = 96
MAX_TOKENS = 512
PROMPT = "the quick brown fox jumps " * 12  # 60 words: about 60 emulator tokens
WARMUP_S = float(os.environ.get("ADAPTIVE_BENCH_WARMUP_S", "10"))
MEASURE_S = float(os.environ.get("ADAPTIVE_BENCH_MEASURE_S", "25"))
ENGINE_FLAGS = (
    "--max-model-len", "1024", "--kv-tokens", "8192", "--block-size", "16",
    "--max-num-seqs", "64", "--tokens-per-s", "25", "--completion-median-ratio", "0.1",
    "--completion-sigma", "1.0", "--seed", "7",
)  # fmt: skip


@dataclass
class Tally:
    """What the clients saw inside the measurement window."""

    completed: int = 0
    tokens: int = 0
    busy: int = 0
    errors: int = 0
    ttft_s: list[float] = field(default_factory=list)


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str] | None = None) -> Iterator[None]:
    """A server in its own process group, stopped by its PID however the block ends."""
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield None
    finally:
        stop(proc)


async def wait_ok(session: aiohttp.ClientSession, url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(url) as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s}s")


async def preemptions(session: aiohttp.ClientSession, engine: str) -> float:
    async with session.get(f"{engine}/metrics") as response:
        text = await response.text()
    for line in text.splitlines():
        if PREEMPTION_COUNTER and line.startswith(PREEMPTION_COUNTER):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def one_request(
    session: aiohttp.ClientSession, url: str, tally: Tally, window: list[float]
) -> None:
    body = {"model": "emulated-llama", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "stream": True}
    started = time.monotonic()
    first: float | None = None
    tokens = 0
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            tally.busy += response.status in (429, 503)
            tally.errors += response.status not in (429, 503)
            await response.read()
            await asyncio.sleep(0.25)
            return
        async for line in response.content:
            if line.startswith(b"event: fallback"):
                tally.busy += 1
                await asyncio.sleep(0.25)
                return
            if line.startswith(b"data: {"):
                first = first or time.monotonic()
                tokens += 1
    ended = time.monotonic()
    if window[0] <= ended <= window[1]:
        tally.completed += 1
        tally.tokens += tokens
        tally.ttft_s.append((first or ended) - started)


async def client(
    session: aiohttp.ClientSession, url: str, tally: Tally, window: list[float]
) -> None:
    while time.monotonic() < window[1]:
        try:
            await one_request(session, url, tally, window)
        except (aiohttp.ClientError, OSError):
            tally.errors += 1
            await asyncio.sleep(0.25)


def sidecar_env(engine: str, mode: str, port: int, admin: int) -> dict[str, str]:
    return {
        **os.environ,
        "SIDECAR_UPSTREAM_URL": engine,
        "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_PORT": str(port),
        "SIDECAR_ADMIN_HOST": "127.0.0.1",
        "SIDECAR_ADMIN_PORT": str(admin),
        "SIDECAR_CAPACITY_SOURCE": ENGINE,
        "SIDECAR_ADMISSION": mode,
        "SIDECAR_MAX_PROMPT_TOKENS": "256",
        "SIDECAR_MAX_COMPLETION_TOKENS": str(MAX_TOKENS),
        "SIDECAR_MAX_QUEUE": str(CLIENTS),
        "SIDECAR_MAX_WAIT_MS": "20000",
        "SIDECAR_REFRESH_MS": "250",
        "SIDECAR_REJECT_MODE": "http",
        "SIDECAR_LOG_LEVEL": "warning",
    }


async def run_mode(mode: str) -> tuple[Tally, float]:
    """One mode, on a fresh engine; returns the clients' tally and the engine's preemptions."""
    engine_port, port, admin = free_port(), free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    emulator = [PYTHON, "-m", "emulator", "--port", str(engine_port), "--engine", ENGINE]
    emulator += ENGINE_FLAGS
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        with process(emulator):
            await wait_ok(session, f"{engine}/health")
            with contextlib.ExitStack() as stack:
                url = engine
                if mode != "none":
                    env = sidecar_env(engine, mode, port, admin)
                    stack.enter_context(process([SIDECAR, "serve"], env))
                    await wait_ok(session, f"http://127.0.0.1:{admin}/readyz")
                    url = f"http://127.0.0.1:{port}"
                watch = asyncio.create_task(watch_capacity(session, admin, mode))
                try:
                    return await measure(session, url, engine)
                finally:
                    watch.cancel()


async def watch_capacity(session: aiohttp.ClientSession, admin: int, mode: str) -> None:
    """Adaptive only: print the over-commit terms every few seconds (what an operator watches)."""
    if mode != "adaptive":
        return
    while True:
        await asyncio.sleep(5)
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with session.get(f"http://127.0.0.1:{admin}/capacity") as response:
                doc = await response.json()
            terms = doc["adaptive"]
            expected = [e["tokens"] for e in terms["expected_completion_tokens"]]
            print(
                f"  adaptive: ratio {terms['overcommit_ratio']} (last pressure "
                f"{terms['last_pressure']}), limit {terms['limit_tokens']} tokens, ledger "
                f"{terms['ledger_tokens']} held / {terms['ledger_reserved_tokens']} reserved, "
                f"engine KV usage {doc['engine_kv_usage_ratio']}, in flight {doc['in_use']}, "
                f"expected completion {expected}"
            )


async def measure(session: aiohttp.ClientSession, url: str, engine: str) -> tuple[Tally, float]:
    tally = Tally()
    start = time.monotonic() + WARMUP_S
    window = [start, start + MEASURE_S]
    clients = [asyncio.create_task(client(session, url, tally, window)) for _ in range(CLIENTS)]
    await asyncio.sleep(WARMUP_S)
    before = await preemptions(session, engine)
    await asyncio.sleep(MEASURE_S)
    after = await preemptions(session, engine)
    for task in clients:
        task.cancel()
    await asyncio.gather(*clients, return_exceptions=True)
    return tally, after - before


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def main() -> None:
    print(
        f"emulated paged engine ({ENGINE}): 8192 KV tokens, 64 seqs, 25 tok/s/stream; "
        f"{CLIENTS} closed-loop clients, max_tokens {MAX_TOKENS}, "
        f"completions lognormal median {MAX_TOKENS // 10}; "
        f"{WARMUP_S:.0f}s warm-up, {MEASURE_S:.0f}s measured"
    )
    results = {mode: asyncio.run(run_mode(mode)) for mode in MODES}
    base = results["none"][0].tokens if "none" in results else 1
    tokens_mode = results["tokens"][0].tokens if "tokens" in results else 1
    print(
        "| mode | goodput tok/s | vs none | vs tokens | completed | preempt/completed | "
        "TTFT p50 s | TTFT p99 s | busy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, (tally, preempted) in results.items():
        per = preempted / tally.completed if tally.completed else float("nan")
        print(
            f"| {mode} | {tally.tokens / MEASURE_S:.0f} | {tally.tokens / base:.2f}x | "
            f"{tally.tokens / tokens_mode:.2f}x | {tally.completed} | {per:.3f} | "
            f"{percentile(tally.ttft_s, 0.5):.2f} | {percentile(tally.ttft_s, 0.99):.2f} | "
            f"{tally.busy} |"
        )
    errors = {mode: tally.errors for mode, (tally, _) in results.items()}
    print(f"client errors (not busy answers): {json.dumps(errors)}")


if __name__ == "__main__":
    main()
