"""Relay cost: the same streams straight to the emulated engine and through the sidecar, one run.

Prints chunks/s both ways and their ratio, and the TTFT the sidecar adds at p50 and p99. The
engine generates as fast as it can, so what is measured is the proxy's own cost per chunk. Each
request is measured in bytes the client received; chunk counts depend on how TCP coalesces.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

STREAMS = int(os.environ.get("BENCH_STREAMS", "400"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "16"))
TOKENS = 64
BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "benchmark"}],
    "stream": True,
    "max_tokens": TOKENS,
}


async def _one(session: aiohttp.ClientSession, url: str) -> tuple[float, int]:
    started = time.perf_counter()
    ttft, chunks = 0.0, 0
    async with session.post(url, json=BODY) as response:
        async for chunk in response.content.iter_any():
            if not chunks:
                ttft = time.perf_counter() - started
            chunks += len(chunk)
    return ttft, chunks


async def _run(url: str) -> tuple[float, list[float], int]:
    """Seconds for all streams, every stream's TTFT, bytes received."""
    gate = asyncio.Semaphore(CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def bounded() -> tuple[float, int]:
            async with gate:
                return await _one(session, url)

        started = time.perf_counter()
        results = await asyncio.gather(*(bounded() for _ in range(STREAMS)))
        elapsed = time.perf_counter() - started
    return elapsed, [ttft for ttft, _ in results], sum(chunks for _, chunks in results)


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _ready(url: str, process: subprocess.Popen[bytes]) -> None:
    """Poll until ``url`` answers 200; bounded, and fails fast if the process died."""
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            if process.poll() is not None:
                raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} not ready")


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def bench() -> None:
    """Engine and sidecar each in their own process, as in a pod; the client here."""
    engine_port, proxy_port, admin_port = _free_port(), _free_port(), _free_port()
    engine_url = f"http://127.0.0.1:{engine_port}"
    processes = [
        _start(
            [
                sys.executable,
                "-m",
                "emulator",
                "--port",
                str(engine_port),
                "--model-name",
                "bench",
                "--tokens-per-s",
                "0",
                "--kv-tokens",
                str(1 << 20),
                "--max-num-seqs",
                "256",
            ]
        )
    ]
    processes.append(
        _start(
            [sys.executable, "-m", "sidecar", "serve"],
            {
                "SIDECAR_UPSTREAM_URL": engine_url,
                "SIDECAR_HOST": "127.0.0.1",
                "SIDECAR_ADMIN_HOST": "127.0.0.1",
                "SIDECAR_PORT": str(proxy_port),
                "SIDECAR_ADMIN_PORT": str(admin_port),
                "SIDECAR_CAPACITY_SOURCE": "static",
                "SIDECAR_MODEL": "qwen2.5-7b",
                "SIDECAR_VRAM_TOTAL": "80GiB",
                "SIDECAR_WEIGHTS": "15GiB",
                "SIDECAR_MAX_QUEUE": "1000",
                "SIDECAR_LOG_LEVEL": "warning",
            },
        )
    )
    try:
        await _ready(f"{engine_url}/health", processes[0])
        await _ready(f"http://127.0.0.1:{admin_port}/readyz", processes[1])
        sidecar_url = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
        await _run(sidecar_url)  # warm both paths up
        urls = {"direct": f"{engine_url}/v1/chat/completions", "sidecar": sidecar_url}
        # Alternate the two paths and keep each one's best round, so neither pays for going first.
        cpu_before = _cpu_seconds(processes[1].pid)
        rounds = [(name, await _run(url)) for _ in range(2) for name, url in urls.items()]
        sidecar_cpu = (_cpu_seconds(processes[1].pid) - cpu_before) / 2
        results = {
            name: min((r for n, r in rounds if n == name), key=lambda r: r[0]) for name in urls
        }
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=30)
    _report(results)
    # On a 2-core machine client, engine and sidecar share the cores, so the ratios above also
    # measure contention; the sidecar's own CPU time per stream does not.
    per_stream = sidecar_cpu / STREAMS
    print(
        f"  sidecar CPU per stream: {per_stream * 1e3:.2f} ms "
        f"({per_stream / TOKENS * 1e6:.0f} us per relayed token, admission and checks included)"
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _report(results: dict[str, tuple[float, list[float], int]]) -> None:
    rate = {name: STREAMS * TOKENS / elapsed for name, (elapsed, _, _) in results.items()}
    print(
        f"{STREAMS} streams x {TOKENS} tokens, {CONCURRENCY} at a time; "
        "emulated engine at full speed, engine and sidecar in their own processes"
    )
    for name, (elapsed, ttfts, received) in results.items():
        print(
            f"  {name:8} {received / 1e6:5.2f} MB in {elapsed:5.2f} s = "
            f"{rate[name]:7.0f} tokens/s   "
            f"TTFT p50 {_p(ttfts, 50) * 1e3:6.2f} ms  p99 {_p(ttfts, 99) * 1e3:6.2f} ms"
        )
    direct, via = results["direct"][1], results["sidecar"][1]
    print(f"  throughput ratio sidecar/direct: {rate['sidecar'] / rate['direct']:.2f}")
    print(
        f"  TTFT added by the sidecar: p50 {(_p(via, 50) - _p(direct, 50)) * 1e3:+.2f} ms, "
        f"p99 {(_p(via, 99) - _p(direct, 99)) * 1e3:+.2f} ms"
    )


def main() -> None:
    asyncio.run(bench())


if __name__ == "__main__":
    main()
