"""`make bench-capacity`: does the sidecar let the engine serve what it serves alone within SLO?

A GPU-shaped emulated engine (Qwen2.5-14B in BF16 on one H100, below) takes closed-loop users
(2,000-token prompts, ``max_tokens`` 256, hidden lengths; each user honours busy answers' hints
up to 8 times, and its TTFT counts from its first attempt):

1. straight at the engine, a sweep of fixed user counts finds its capacity: the most users whose
   requests meet TTFT <= 2 s and TPOT <= 100 ms at least 95 % of the time, and its best SLO
   goodput;
2. through one ``sidecar serve`` (its defaults), the users step up through 25, 50, 75, 100 and
   150 % of that capacity, as a day's load does; each step beside the engine alone at the same
   count.

Printed per step: requests within the objectives (sidecar and alone), busy answers, requests
running at the engine (mean of its ``vllm:num_requests_running``). Writes .bench/capacity.json.

    CAPACITY_SWEEP     user counts straight at the engine (default 24,32,40,48,56)
    CAPACITY_STEP_S    seconds measured a step, after CAPACITY_WARM_S (defaults 30 and 10)
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from benchmarks.burst import User, body, one_user
from benchmarks.overload import servers
from benchmarks.overload.engine_watch import Timeline, watch

# Qwen2.5-14B: 48 layers x 8 KV heads x 128 x 2 bytes x K and V = 192 KiB of KV a token. On one
# H100 SXM 80 GB (79.2 GiB to CUDA) at 0.9 x that, less ~28 GiB of weights and ~2.5 GiB of
# activations and graphs: ~42 GiB of KV, 229,376 tokens. Prefill: 989 TFLOPS (dense BF16 peak)
# at 40 % over 2 x 14.8e9 FLOPs a token = 13,400 tokens/s. Decode: 40 steps a second.
ENGINE_FLAGS = (
    "--model-name", "qwen2.5-14b", "--kv-tokens", "229376", "--block-size", "16",
    "--bytes-per-token", "196608", "--max-model-len", "32768", "--max-num-seqs", "256",
    "--max-num-batched-tokens", "8192", "--prefill-tokens-per-s", "13400",
    "--tokens-per-s", "40", "--completion-median-ratio", "0.5", "--completion-sigma", "0.8",
)  # fmt: skip
MODEL = "qwen2.5-14b"
PROMPT_WORDS = 2000  # the emulator counts a word a token
MAX_TOKENS = 256
SWEEP = tuple(
    int(n) for n in os.environ.get("CAPACITY_SWEEP", "24,32,40,48,56,64,72,80").split(",")
)
GIVEN = int(os.environ.get("CAPACITY_USERS", "0"))
SHARES = (0.25, 0.5, 0.75, 1.0, 1.5)
STEP_S = float(os.environ.get("CAPACITY_STEP_S", "30"))
WARM_S = float(os.environ.get("CAPACITY_WARM_S", "10"))
OUT = Path(".bench")


@dataclass(frozen=True, slots=True)
class Step:
    users: int
    requests: int  # user requests that began inside the window and ended
    within: int
    busy: int
    running: float
    slo_tokens_per_s: float
    signal: tuple[float, float, float] | None = None  # sidecar_utilisation: mean, low, high

    @property
    def share_within(self) -> float:
        return self.within / self.requests if self.requests else 0.0


class SignalWatch:
    """``sidecar_utilisation`` read from the sidecar's ``/capacity`` every second."""

    def __init__(self, admin: str) -> None:
        self.url, self.seen = admin + "/capacity", list[tuple[float, float]]()

    async def run(self, until: float) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while (now := time.monotonic()) < until:
                async with session.get(self.url) as response:
                    self.seen.append((now, float((await response.json())["utilisation"])))
                await asyncio.sleep(1.0)

    def over(self, start: float, end: float) -> tuple[float, float, float] | None:
        values = [v for at, v in self.seen if start <= at <= end]
        if not values:
            return None
        return sum(values) / len(values), min(values), max(values)

    async def fall_s(self, below: float, limit_s: float = 60.0) -> float:
        """Seconds from now until the signal reads under ``below`` (the load has stopped)."""
        start = time.monotonic()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while (waited := time.monotonic() - start) < limit_s:
                async with session.get(self.url) as response:
                    if float((await response.json())["utilisation"]) < below:
                        return waited
                await asyncio.sleep(0.5)
        return math.inf


async def closed_loop(
    url: str, engine: str, users: int, seed: int, signal: SignalWatch | None = None
) -> Step:
    """``users`` users, each sending its next request when the last one ended, for WARM_S and
    then STEP_S; the requests begun in the second part are counted."""
    rng = random.Random(seed)
    start = time.monotonic()
    window = (start + WARM_S, start + WARM_S + STEP_S)
    done: list[tuple[float, User]] = []
    timeline = Timeline()
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=600)
    ) as session:

        async def user(delay_s: float) -> None:
            await asyncio.sleep(delay_s)  # users arrive over a second, not in one instant
            while (began := time.monotonic()) < window[1]:
                got = await one_user(session, url, body(MODEL, PROMPT_WORDS, rng, MAX_TOKENS))
                done.append((began, got))

        watchers = [asyncio.create_task(watch(engine + "/metrics", timeline, window[1]))]
        if signal is not None:
            watchers.append(asyncio.create_task(signal.run(window[1])))
        await asyncio.gather(*(user(rng.random()) for _ in range(users)))
        await asyncio.gather(*watchers)
    counted = [u for began, u in done if window[0] <= began < window[1]]
    within = [u for u in counted if u.within_slo()]
    return Step(
        users=users,
        requests=len(counted),
        within=len(within),
        busy=sum(u.busy for u in counted),
        running=timeline.mean("running", *window),
        slo_tokens_per_s=sum(u.tokens for u in within) / STEP_S,
        signal=signal.over(*window) if signal is not None else None,
    )


def show(label: str, step: Step) -> None:
    signal = "" if step.signal is None else ", signal {:.2f} ({:.2f}-{:.2f})".format(*step.signal)
    print(
        f"{label:>14} {step.users:>3} users: within {step.within}/{step.requests} "
        f"({step.share_within:.0%}), {step.slo_tokens_per_s:,.0f} SLO tok/s, busy {step.busy}, "
        f"running {step.running:.1f}{signal}",
        flush=True,
    )


async def sweep(engine: str) -> list[Step]:
    steps: list[Step] = []
    for users in () if GIVEN else SWEEP:
        steps.append(await closed_loop(engine, engine, users, users))
        show("alone", steps[-1])
    return steps


def main() -> int:
    servers.pin_clients()
    OUT.mkdir(exist_ok=True)
    logs = OUT / "capacity-logs"
    logs.mkdir(exist_ok=True)
    with servers.emulator(ENGINE_FLAGS, logs / "emulator.log") as engine:
        alone = asyncio.run(sweep(engine))
        capable = [s for s in alone if s.share_within >= 0.95]
        capacity = GIVEN or max((s.users for s in capable), default=SWEEP[0])
        best = max(alone, key=lambda s: s.slo_tokens_per_s, default=None)
        print(
            f"capacity within the objectives: {capacity} users"
            + (
                ""
                if best is None
                else f"; best SLO goodput {best.slo_tokens_per_s:,.0f} tok/s at {best.users}"
            ),
            flush=True,
        )
        counts = [max(1, round(share * capacity)) for share in SHARES]
        rows = []
        with servers.sidecar_ports(engine, None, logs / "sidecar.log") as (front, admin):
            watch_signal = SignalWatch(admin)
            for users in counts:
                through = asyncio.run(closed_loop(front, engine, users, users, watch_signal))
                show("sidecar", through)
                rows.append(through)
            fall_s = asyncio.run(watch_signal.fall_s(0.5))
            print(f"the load stopped: the signal under 0.5 after {fall_s:.1f} s", flush=True)
        beside = [asyncio.run(closed_loop(engine, engine, users, users)) for users in counts]
        for step in beside:
            show("alone", step)
    result = {
        "capacity": capacity,
        "best": None if best is None else asdict(best),
        "signal_fall_s": fall_s,
        "sweep": [asdict(s) for s in alone],
        "sidecar": [asdict(s) for s in rows],
        "alone": [asdict(s) for s in beside],
    }
    (OUT / "capacity.json").write_text(json.dumps(result, indent=1))
    print(
        "\n| load | users | within SLO: sidecar / alone | ratio | busy | running: sidecar / alone "
        "| signal: mean (range) |"
    )
    print("|---|---|---|---|---|---|---|")
    for share, side, own in zip(SHARES, rows, beside, strict=True):
        ratio = side.within / own.within if own.within else float("nan")
        signal = "-" if side.signal is None else "{:.2f} ({:.2f}-{:.2f})".format(*side.signal)
        print(
            f"| {share:.0%} | {side.users} | {side.within}/{side.requests} / "
            f"{own.within}/{own.requests} | {ratio:.2f}x | {side.busy} | "
            f"{side.running:.1f} / {own.running:.1f} | {signal} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
