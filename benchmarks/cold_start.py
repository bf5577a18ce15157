"""`make bench-cold-start`: how fast a fresh sidecar lets a burst through to an empty engine.

96 clients start streaming completions at once, none of them sending ``max_tokens``, through a
`sidecar serve` started a moment before (its defaults) in front of the emulated engine sized as an
H200 holding an 8B model's KV (892,928 tokens of 128 KiB, ``max_model_len`` 32,768, 256
sequences). Printed: how many run at the engine (its ``vllm:num_requests_running``) 5 s after the
clients started, and the most seen until then; the target is at least 48.

    COLD_START_CLIENTS  default 96
    COLD_START_S        default 5
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import time
from pathlib import Path

import aiohttp

from benchmarks.overload import servers
from benchmarks.overload.engine_watch import Timeline, watch
from benchmarks.overload.load import WORDS

ENGINE_FLAGS = (
    "--kv-tokens", "892928", "--bytes-per-token", "131072", "--max-model-len", "32768",
    "--max-num-seqs", "256",
)  # fmt: skip
CLIENTS = int(os.environ.get("COLD_START_CLIENTS", "96"))
WITHIN_S = float(os.environ.get("COLD_START_S", "5"))
TARGET = 48
OUT = Path(".bench")


async def stream_without_max_tokens(session: aiohttp.ClientSession, url: str, seed: int) -> None:
    """One streaming completion of a 20-word prompt, read until the run stops it."""
    rng = random.Random(seed)
    body = {
        "model": "emulated-llama",
        "prompt": " ".join(rng.choice(WORDS) for _ in range(20)),
        "stream": True,
    }
    with contextlib.suppress(aiohttp.ClientError):
        async with session.post(url + "/v1/completions", json=body) as response:
            async for _ in response.content:
                pass


async def burst(url: str, engine_url: str) -> Timeline:
    """CLIENTS streams at once; the engine sampled every half second for WITHIN_S."""
    timeline = Timeline()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        clients = [
            asyncio.create_task(stream_without_max_tokens(session, url, i)) for i in range(CLIENTS)
        ]
        await watch(engine_url + "/metrics", timeline, time.monotonic() + WITHIN_S)
        for client in clients:
            client.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
    return timeline


def main() -> int:
    OUT.mkdir(exist_ok=True)
    with (
        servers.emulator(ENGINE_FLAGS, OUT / "cold-start-emulator.log") as engine_url,
        servers.sidecar(engine_url, None, OUT / "cold-start-sidecar.log") as url,
    ):
        timeline = asyncio.run(burst(url, engine_url))
    running = [int(s.running) for s in timeline.samples]
    last = running[-1] if running else 0
    print(
        f"{CLIENTS} clients without max_tokens, fresh sidecar (defaults), H200-sized emulated "
        f"engine: {last} running at the engine after {WITHIN_S:g} s (most seen: "
        f"{max(running, default=0)}; target >= {TARGET}: {'yes' if last >= TARGET else 'NO'})"
    )
    print("running at the engine, every 0.5 s: " + " ".join(map(str, running)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
