"""The scale-out signal on an H200-sized emulated engine, with the sidecar at its defaults.

Each situation on a fresh engine and sidecar: idle; 96 streaming clients omitting max_tokens (a
cold pod priced at the worst case, the pool hardly touched) and 96 asking for 1,024 tokens; 320
clients from one address (a gateway) and 300 from four, max_tokens 48, more than the engine's 256
sequences. Sampled every half second:
`sidecar_utilisation` (and the share of the admission limit in use, for comparison), the
engine's KV use and queue, the sidecar's queue. Each client counts the busy answers it got
(HTTP 429/503 or an SSE `event: fallback`); the sidecar's refusals are read from
`sidecar_requests_total` after the run, so the two counts can be compared.

    python -m benchmarks.scale_signal            # SCALE_SIGNAL_S=20 per loaded situation
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from benchmarks.adaptive_bench import process, wait_ok
from benchmarks.overload.servers import free_port
from sidecar.core.laws.saturation import CAPACITY_REFUSALS

ENGINE_FLAGS = (
    "--kv-tokens", "892928", "--bytes-per-token", "131072", "--max-model-len", "32768",
    "--max-num-seqs", "256",
)  # fmt: skip
RUN_S = float(os.environ.get("SCALE_SIGNAL_S", "20"))
PROMPT = "the quick brown fox jumps " * 12


@dataclass
class Seen:
    """What clients saw, and what was sampled while they ran."""

    ok: int = 0
    busy: int = 0
    errors: int = 0
    utilisation: list[float] = field(default_factory=list)
    limit_share: list[float] = field(default_factory=list)
    kv: list[float] = field(default_factory=list)
    engine_waiting: list[float] = field(default_factory=list)
    queued: list[float] = field(default_factory=list)


async def one(session: aiohttp.ClientSession, url: str, max_tokens: int | None, seen: Seen) -> None:
    body: dict[str, Any] = {"model": "emulated-llama", "prompt": PROMPT, "stream": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            seen.busy += response.status in (429, 503)
            seen.errors += response.status not in (429, 503)
            await response.read()
            await asyncio.sleep(0.25)
            return
        async for line in response.content:
            if line.startswith(b"event: fallback"):
                seen.busy += 1
                await asyncio.sleep(0.25)
                return
    seen.ok += 1


async def client(url: str, local: str, max_tokens: int | None, seen: Seen, until: float) -> None:
    connector = aiohttp.TCPConnector(limit=0, local_addr=(local, 0))
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        while time.monotonic() < until:
            try:
                await one(session, url, max_tokens, seen)
            except (aiohttp.ClientError, OSError):
                seen.errors += 1
                await asyncio.sleep(0.25)


def gauges(text: str) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = values.get(name, 0.0) + float(value)
    return values


async def sample(session: aiohttp.ClientSession, admin: str, engine: str, seen: Seen) -> None:
    async with session.get(f"{admin}/capacity") as response:
        capacity = await response.json()
    async with session.get(f"{engine}/metrics") as response:
        metrics = gauges(await response.text())
    seen.utilisation.append(capacity["utilisation"])
    seen.limit_share.append(capacity["limit_utilisation"])
    seen.queued.append(capacity["queued"])
    seen.kv.append(sum(v for k, v in metrics.items() if k.startswith("vllm:kv_cache_usage_perc")))
    seen.engine_waiting.append(
        sum(v for k, v in metrics.items() if k.startswith("vllm:num_requests_waiting{"))
    )


async def refusals(session: aiohttp.ClientSession, admin: str) -> float:
    async with session.get(f"{admin}/metrics") as response:
        text = await response.text()
    return sum(
        v
        for k, v in gauges(text).items()
        if k.startswith("sidecar_requests_total")
        and k.split('outcome="')[1].split('"')[0] in CAPACITY_REFUSALS
    )


async def situation(clients: int, addresses: int, max_tokens: int | None) -> Seen:
    engine_port, port, admin_port = free_port(), free_port(), free_port()
    engine, url, admin = (f"http://127.0.0.1:{p}" for p in (engine_port, port, admin_port))
    env = {
        **os.environ,
        "SIDECAR_UPSTREAM_URL": engine,
        "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_ADMIN_HOST": "127.0.0.1",
        "SIDECAR_PORT": str(port),
        "SIDECAR_ADMIN_PORT": str(admin_port),
        "SIDECAR_LOG_LEVEL": "warning",
    }
    seen = Seen()
    emulator = [sys.executable, "-m", "emulator", "--port", str(engine_port), *ENGINE_FLAGS]
    with process(emulator), process([sys.executable, "-m", "sidecar", "serve"], env):
        async with aiohttp.ClientSession() as session:
            await wait_ok(session, f"{engine}/v1/models")
            await wait_ok(session, f"{admin}/readyz")
            until = time.monotonic() + RUN_S
            locals_ = [f"127.0.0.{1 + i % addresses}" for i in range(clients)]
            tasks = [
                asyncio.create_task(client(url, local, max_tokens, seen, until))
                for local in locals_
            ]
            await asyncio.sleep(min(3.0, RUN_S / 4) if clients else 1.0)
            while time.monotonic() < until:
                await sample(session, admin, engine, seen)
                await asyncio.sleep(0.5)
            if not clients:
                await sample(session, admin, engine, seen)
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)
            counted = await refusals(session, admin)
    print(
        f"| {clients} clients, {addresses} address(es), max_tokens {max_tokens} "
        f"| {min(seen.utilisation):.2f}-{max(seen.utilisation):.2f} "
        f"| {max(seen.limit_share):.2f} | {max(seen.kv):.4f} | {max(seen.engine_waiting):.0f} "
        f"| {max(seen.queued):.0f} | {seen.ok} | {seen.busy} | {counted:.0f} | {seen.errors} |",
        flush=True,
    )
    return seen


async def main() -> None:
    print(
        "| situation | sidecar_utilisation min-max | limit share max | engine KV max "
        "| engine waiting max | sidecar queue max | completed | busy seen by clients "
        "| refusals counted | errors |\n|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    await situation(0, 1, None)
    await situation(96, 1, None)
    await situation(96, 1, 1024)
    await situation(320, 1, 48)
    await situation(300, 4, 48)


if __name__ == "__main__":
    asyncio.run(main())
