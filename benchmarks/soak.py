"""`make soak`: thousands of requests through a sidecar in front of the emulator, with every kind of
client and engine misbehaviour, while capacity shrinks, grows, fails and hangs under load.

At the end: permits in use 0, queue 0, granted == released, descriptors and RSS flat across
rounds, and every well-behaved client got exactly one of a complete stream, a busy answer or a
clean error. Prints the figures; exits 1 if any check fails. SOAK_REQUESTS sets the size
(default 10000), SOAK_CONCURRENCY the number of clients at once (default 48); it runs on the loop
`sidecar serve` would (SIDECAR_EVENT_LOOP, default auto: uvloop where installed).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import struct
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

from benchmarks.loops import run_as_serve
from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.core.errors import ProbeTemporaryError
from sidecar.core.outcomes import REQUEST_OUTCOMES
from sidecar.entry.app import SidecarServer
from sidecar.entry.event_loop import running_loop_name
from sidecar.entry.logs import configure_logging
from sidecar.entry.settings import load_settings
from sidecar.limiter.events import BulkheadSnapshot
from sidecar.live.probes import GpuReading, GpuSnapshot, ProcessMemory
from tests.servers import TINY_MODEL, serve_app

MIB = 1024**2
REQUEST_BYTES = 131_072  # tiny model: 1,024 B/token x 128 tokens
ROUNDS = 5
SOAK_SETTINGS = {
    "HOST": "127.0.0.1",
    "ADMIN_HOST": "127.0.0.1",
    "PORT": "0",
    "ADMIN_PORT": "0",
    "MODEL": str(TINY_MODEL),
    "CAPACITY_SOURCE": "nvml",
    "WEIGHTS": str(2 * MIB),
    "OVERHEAD": str(2 * MIB),
    "SAFETY_FACTOR": "1",
    "MAX_PROMPT_TOKENS": "100",
    "MAX_COMPLETION_TOKENS": "28",
    "MAX_QUEUE": "16",
    "MAX_WAIT_MS": "500",
    "REFRESH_MS": "200",
    "PROBE_TIMEOUT_MS": "300",
    "STALE_AFTER_MS": "1500",
    "UPSTREAM_READ_TIMEOUT_MS": "1000",
    "CLIENT_WRITE_TIMEOUT_MS": "500",
    "BODY_TIMEOUT_MS": "1000",
    "LOG_LEVEL": "error",
}


class WeatherGpu:
    """A GPU whose free memory the soak changes under load: grows, shrinks, fails, hangs."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.permits = 8
        self.reads = Counter[str]()

    async def read(self) -> GpuSnapshot:
        roll = self.rng.random()
        if roll < 0.1:
            self.reads["error"] += 1
            raise ProbeTemporaryError("soak: GPU busy")
        if roll < 0.15:
            self.reads["hang"] += 1
            await asyncio.sleep(5)  # past the probe timeout: abandoned
        self.permits = max(1, min(12, self.permits + self.rng.choice((-3, -1, 0, 1, 3))))
        self.reads["ok"] += 1
        total = 5 * MIB + 12 * REQUEST_BYTES
        neighbour = (12 - self.permits) * REQUEST_BYTES
        procs = (
            ProcessMemory(1, 4 * MIB + self.permits * REQUEST_BYTES),
            ProcessMemory(2, neighbour),
        )
        gpu = GpuReading(0, "GPU-0", "Soak GPU", total, 0, 0, None, procs, mig_enabled=False)
        return GpuSnapshot((gpu,), observed_at=0.0)

    async def close(self) -> None:
        return None


def fds() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


BODY = {"model": "tiny-llama", "prompt": "soak", "max_tokens": 20, "stream": True}
FAULTS = ["", "", "", "reset-after=3", "status=503", "stall-after=2", "slow-first-token=0.3"]
WELL_BEHAVED = ("stream", "whole", "fault")
HOSTILE = ("fin_sending", "rst_sending", "after_headers", "mid_stream", "stalled", "queued_gone")


def classify(status: int, body: bytes) -> str:
    """complete, busy or error: exactly one, or 'broken' (the soak fails on any)."""
    if status in (429, 503):
        return "busy"
    if status != 200:
        return "error" if _is_error(body) else "broken"
    if b"event: fallback" in body:
        return "busy"
    if body.lstrip().startswith(b"{"):
        return "complete" if b'"choices"' in body else "broken"
    if not body.rstrip().endswith(b"data: [DONE]"):
        return "broken"
    return "error" if b'data: {"error"' in body else "complete"


def _is_error(body: bytes) -> bool:
    try:
        return "error" in json.loads(body)
    except ValueError:
        return False


async def well_behaved(
    session: aiohttp.ClientSession, url: str, kind: str, rng: random.Random
) -> str:
    body = {**BODY, "stream": kind != "whole"}
    fault = rng.choice(FAULTS) if kind == "fault" else ""
    headers = {"x-emulator-fault": fault} if fault else {}
    try:
        async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
            return classify(r.status, await r.read())
    except aiohttp.ClientPayloadError:
        return "error"  # a cut-off non-SSE body: the client sees an error, as designed


async def raw(port: int, kind: str, rng: random.Random) -> None:
    """The hostile clients: hang up at every phase, with FIN or RST, or never read."""
    body = json.dumps({**BODY, "max_tokens": 20}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if kind in ("fin_sending", "rst_sending"):
            writer.write(head + body[: len(body) // 2])
            await asyncio.sleep(rng.random() * 0.05)
            if kind == "rst_sending":
                _rst(writer)
            return
        writer.write(head + body)
        if kind == "after_headers":
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        elif kind == "mid_stream":
            await asyncio.wait_for(reader.readuntil(b"\n\n"), 5)
            if rng.random() < 0.5:
                _rst(writer)
        elif kind == "stalled":
            await asyncio.sleep(1.0)  # never reads; the write deadline ends it
        elif kind == "queued_gone":
            await asyncio.sleep(rng.random() * 0.2)
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def one_round(
    server: SidecarServer, count: int, concurrency: int, rng: random.Random
) -> Counter[str]:
    url = f"http://127.0.0.1:{server.proxy_port}"
    outcomes = Counter[str]()
    slots = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=30)

    async def client(session: aiohttp.ClientSession, i: int) -> None:
        kinds = WELL_BEHAVED * 3 + HOSTILE
        kind = kinds[i % len(kinds)]
        async with slots:
            if kind in WELL_BEHAVED:
                outcomes[await well_behaved(session, url, kind, rng)] += 1
            else:
                await raw(server.proxy_port, kind, rng)
                outcomes["hostile"] += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(client(session, i) for i in range(count)))
    return outcomes


async def settle(server: SidecarServer) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        snap = server.bulkhead.snapshot()
        if snap.in_use == 0 and snap.queued == 0:
            return
        await asyncio.sleep(0.05)


async def soak(total: int, concurrency: int) -> int:
    rng = random.Random(10)
    engine, engine_url = await serve_app(
        build_app(EmulatorConfig(model_name="tiny-llama", tokens_per_s=400))
    )
    env = {f"SIDECAR_{name}": value for name, value in SOAK_SETTINGS.items()}
    env["SIDECAR_UPSTREAM_URL"] = engine_url
    gpu = WeatherGpu(rng)
    configure_logging("error")
    server = SidecarServer(load_settings(env), gpu_probe=gpu)
    await server.start()
    print(f"  event loop: {running_loop_name()}")
    started, totals = time.monotonic(), Counter[str]()
    figures: list[tuple[int, int, float, int]] = []
    limits: set[int] = set()
    sampler = asyncio.create_task(sample_limits(server, limits), name="soak-limit-sampler")
    try:
        for round_no in range(ROUNDS):
            totals += await one_round(server, total // ROUNDS, concurrency, rng)
            await settle(server)
            # Both ends of each kept-alive engine connection are in this process: bounded by the
            # pool (and by each round's peak concurrency), they are not what a leak looks like.
            pooled = 2 * server.upstream.idle
            figures.append((round_no, fds() - pooled, rss_mib(), pooled))
    finally:
        sampler.cancel()
        snap = server.bulkhead.snapshot()
        print(f"  sidecar outcomes: {outcomes_of(server)}")
        await server.stop()
        await engine.cleanup()
    print(f"  bulkhead limits seen under load: {sorted(limits)}")
    return report(snap, figures, totals, gpu, time.monotonic() - started)


def outcomes_of(server: SidecarServer) -> dict[str, int]:
    """sidecar_requests_total by outcome, as /metrics reports it."""
    counts = {}
    for outcome in REQUEST_OUTCOMES:
        value = server.registry.get_sample_value("sidecar_requests_total", {"outcome": outcome})
        if value:
            counts[outcome] = int(value)
    return counts


async def sample_limits(server: SidecarServer, seen: set[int]) -> None:
    while True:
        seen.add(server.bulkhead.snapshot().limit)
        await asyncio.sleep(0.05)


def report(
    snap: BulkheadSnapshot,
    figures: list[tuple[int, int, float, int]],
    totals: Counter[str],
    gpu: WeatherGpu,
    elapsed: float,
) -> int:
    released = sum(snap.released.values())
    checks = {
        "permits in use 0": snap.in_use == 0,
        "queue 0": snap.queued == 0,
        "granted == released": snap.granted_total == released,
        "no broken answers": totals["broken"] == 0,
        "fds flat (last - first round <= 8, pooled engine connections aside)": (
            figures[-1][1] - figures[0][1] <= 8
        ),
        "RSS flat (last - first round <= 25 MiB)": figures[-1][2] - figures[0][2] <= 25,
    }
    print(f"soak: {sum(totals.values())} requests in {elapsed:.1f}s")
    print(f"  client outcomes: {dict(totals)}")
    print(
        f"  granted {snap.granted_total}, released {dict(snap.released)}, rejected {snap.rejected}"
    )
    print(f"  GPU probe reads: {dict(gpu.reads)}")
    for round_no, fd_count, rss, pooled in figures:
        print(f"  round {round_no}: fds {fd_count} (+{pooled} pooled), RSS {rss:.1f} MiB")
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")
    return 0 if all(checks.values()) else 1


def main() -> int:
    total = int(os.environ.get("SOAK_REQUESTS", "10000"))
    concurrency = int(os.environ.get("SOAK_CONCURRENCY", "48"))
    return run_as_serve(soak(total, concurrency))


if __name__ == "__main__":
    sys.exit(main())
