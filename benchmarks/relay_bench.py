"""Relay cost: the same SSE streams direct, through the sidecar and through nginx, in one run.

At each concurrency (1, 64, 256 by default) every target gets the same load from a lean client:
events per second relative to direct, the proxy's CPU microseconds per relayed event (its
utime+stime from /proc over the events it relayed: contention on a small machine does not skew
it), and the TTFT it adds at p50 and p99 over direct. The engine is ``benchmarks.sse_engine``,
which streams as fast as it can, so the proxy is what is measured. nginx (1 worker, no buffering,
kept-alive HTTP/1.1 upstream) is the C reference when installed; without it the rest still runs.

Streams at full speed saturate the proxy, so their TTFT is queueing in its loop. The latency rows
are a second load: 64 streams paced by the engine (BENCH_RELAY_PACE_MS between events, 10: an
engine decoding 100 tokens/s per stream), their starts spread over one stream's length, for
BENCH_RELAY_PACED_SECONDS (6); BENCH_RELAY_PACE_MS=0 leaves them out.

Targets, PASS/MISS in the same run: CPU per relayed event at 64 streams <= 1.25x
nginx's; added TTFT p50 at 64 paced streams <= nginx's added TTFT p50 + 0.3 ms.

Sizes: BENCH_RELAY_LEVELS (1,64,256), BENCH_RELAY_SECONDS per measurement (3), BENCH_RELAY_ROUNDS
(2, best round kept), BENCH_RELAY_EVENTS token events per stream (64), BENCH_RELAY_TARGETS
(direct,sidecar,nginx), BENCH_RELAY_JSON (.bench/relay.json).
SIDECAR_* variables in the environment reach the sidecar (e.g. SIDECAR_LOG_LEVEL=info);
BENCH_SIDECAR_PROFILE=FILE runs it under cProfile and writes its stats to FILE.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.loops import loop_factory, run, serve_loop
from benchmarks.nginx_proxy import INSTALL_HINT, nginx_binary, start_nginx, worker_pids
from benchmarks.stream_client import LoadResult, load

LEVELS = [int(n) for n in os.environ.get("BENCH_RELAY_LEVELS", "1,64,256").split(",")]
SECONDS = float(os.environ.get("BENCH_RELAY_SECONDS", "3"))
ROUNDS = int(os.environ.get("BENCH_RELAY_ROUNDS", "2"))
TOKENS = int(os.environ.get("BENCH_RELAY_EVENTS", "64"))
EVENTS_PER_STREAM = TOKENS + 2  # the role event, the tokens, [DONE]
TARGETS = os.environ.get("BENCH_RELAY_TARGETS", "direct,sidecar,nginx").split(",")
JSON_PATH = Path(os.environ.get("BENCH_RELAY_JSON", ".bench/relay.json"))
MAX_STREAMS = 200_000
TTFT_LEVEL = 64
# The latency rows: TTFT_LEVEL streams paced at one event per PACE_MS each (an engine decoding
# at 1000 / PACE_MS tokens/s per stream), starts staggered; 0 leaves them out.
PACE_MS = float(os.environ.get("BENCH_RELAY_PACE_MS", "10"))
PACED_SECONDS = float(os.environ.get("BENCH_RELAY_PACED_SECONDS", "6"))
# The targets: the sidecar's CPU per relayed event against nginx's at TTFT_LEVEL streams, and the
# TTFT it adds (paced rows, p50) beyond what nginx adds.
CPU_VS_NGINX = 1.25
ADDED_TTFT_OVER_NGINX_MS = 0.3


@dataclass(frozen=True)
class Row:
    """One target at one concurrency, as printed and written to JSON."""

    level: int
    target: str
    streams: int
    failures: int
    events_per_s: float
    vs_direct: float | None
    proxy_cpu_us_per_event: float | None
    # Of the proxy's CPU, the share spent in user space (its own code); the rest is the kernel's.
    proxy_user_share: float | None
    engine_cpu_us_per_event: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    added_ttft_p50_ms: float | None
    added_ttft_p99_ms: float | None
    paced_ms: float = 0.0  # 0: streams at full speed (saturating); else ms between events


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Cpu:
    """CPU seconds of processes, all their threads, from /proc (Linux): user and system."""

    user: float
    system: float

    @property
    def total(self) -> float:
        return self.user + self.system

    def __sub__(self, before: Cpu) -> Cpu:
        return Cpu(self.user - before.user, self.system - before.system)


def _cpu_seconds(pids: list[int]) -> Cpu:
    user = system = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        user, system = user + int(fields[11]), system + int(fields[12])
    tick = os.sysconf("SC_CLK_TCK")
    return Cpu(user / tick, system / tick)


def _cores() -> tuple[set[int], set[int], set[int]]:
    """Cores for the proxy, the engine and the client: the proxy gets one of its own."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 3:
        return {cpus[0]}, {cpus[1]}, set(cpus[2:])
    if len(cpus) == 2:
        return {cpus[0]}, {cpus[1]}, {cpus[1]}
    return set(cpus), set(cpus), set(cpus)


@contextlib.contextmanager
def _pinned(cpus: set[int]) -> Iterator[None]:
    """Start children inside this block on ``cpus`` (they inherit this process's affinity)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _ready(
    port: int, path: str, process: subprocess.Popen[bytes], timeout_s: float = 20.0
) -> None:
    """Poll until GET ``path`` answers 200; bounded, and fails fast if the process died."""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    for _ in range(int(timeout_s / 0.05)):
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            status = await reader.readline()
            writer.close()
            if b" 200 " in status:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"127.0.0.1:{port}{path} not ready")


def _sidecar_args() -> list[str]:
    profile = os.environ.get("BENCH_SIDECAR_PROFILE")
    if profile:
        return [sys.executable, "-m", "cProfile", "-o", profile, "-m", "sidecar", "serve"]
    return [sys.executable, "-m", "sidecar", "serve"]


def _sidecar_env(engine_port: int, port: int, admin_port: int) -> dict[str, str]:
    env = {
        "SIDECAR_UPSTREAM_URL": f"http://127.0.0.1:{engine_port}",
        "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_ADMIN_HOST": "127.0.0.1",
        "SIDECAR_PORT": str(port),
        "SIDECAR_ADMIN_PORT": str(admin_port),
        "SIDECAR_CAPACITY_SOURCE": "static",
        "SIDECAR_MODEL": "qwen2.5-7b",
        "SIDECAR_VRAM_TOTAL": "80GiB",
        "SIDECAR_WEIGHTS": "15GiB",
        "SIDECAR_MAX_PROMPT_TOKENS": "256",
        "SIDECAR_MAX_COMPLETION_TOKENS": "256",  # ~1,800 permits: nothing queues at 256 streams
        "SIDECAR_MAX_QUEUE": "1000",
        "SIDECAR_LOG_LEVEL": "warning",
    }
    return env | {k: v for k, v in os.environ.items() if k.startswith("SIDECAR_")}


@dataclass
class _Target:
    name: str
    port: int
    process: subprocess.Popen[bytes] | None
    pids: list[int]


async def _measure(
    target: _Target, engine_pid: int, level: int, *, paced: bool = False
) -> tuple[LoadResult, Cpu, Cpu]:
    """The best of ROUNDS loads (paced: one): its result, proxy and engine CPU s during it."""
    best: tuple[LoadResult, Cpu, Cpu] | None = None
    for _ in range(1 if paced else ROUNDS):
        proxy0, engine0 = _cpu_seconds(target.pids), _cpu_seconds([engine_pid])
        result = await load(
            target.port,
            concurrency=level,
            seconds=PACED_SECONDS if paced else SECONDS,
            max_streams=MAX_STREAMS,
            max_tokens=TOKENS,
            gap_ms=PACE_MS if paced else 0.0,
            stagger_s=EVENTS_PER_STREAM * PACE_MS / 1e3 if paced else 0.0,
        )
        measured = (
            result,
            _cpu_seconds(target.pids) - proxy0,
            _cpu_seconds([engine_pid]) - engine0,
        )
        if best is None or _rate(result) > _rate(best[0]):
            best = measured
    assert best is not None
    return best


def _rate(result: LoadResult) -> float:
    return result.streams * EVENTS_PER_STREAM / result.elapsed_s


def _p(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def _start_targets(
    engine_port: int, tmp: Path, cores: set[int], started: list[subprocess.Popen[bytes]]
) -> list[_Target]:
    """Start the proxies; each joins ``started`` before its readiness wait, so that one that
    never gets ready is stopped with the rest."""
    targets = []
    if "direct" in TARGETS:
        targets.append(_Target("direct", engine_port, None, []))
    if "sidecar" in TARGETS:
        port, admin = _free_port(), _free_port()
        with _pinned(cores):
            sidecar = _start(_sidecar_args(), _sidecar_env(engine_port, port, admin))
        started.append(sidecar)
        await _ready(admin, "/readyz", sidecar)
        targets.append(_Target("sidecar", port, sidecar, [sidecar.pid]))
    binary = nginx_binary() if "nginx" in TARGETS else None
    if "nginx" in TARGETS and binary is None:
        print(f"  {INSTALL_HINT}")
    if binary is not None:
        port = _free_port()
        with _pinned(cores):
            nginx = start_nginx(binary, tmp, port, engine_port)
        started.append(nginx)
        await _ready(port, "/health", nginx)
        targets.append(_Target("nginx", port, nginx, [nginx.pid, *worker_pids(nginx.pid)]))
    return targets


async def bench() -> list[Row]:
    proxy_cores, engine_cores, client_cores = _cores()
    engine_port = _free_port()
    with _pinned(engine_cores):
        engine = _start(
            [
                sys.executable,
                "-m",
                "benchmarks.sse_engine",
                "--port",
                str(engine_port),
                "--events",
                str(TOKENS),
            ]
        )
    started = [engine]
    rows: list[Row] = []
    with _pinned(client_cores), tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        try:
            await _ready(engine_port, "/health", engine)
            targets = await _start_targets(engine_port, Path(tmp), proxy_cores, started)
            for target in targets:  # warm every path up once
                await load(
                    target.port, concurrency=8, seconds=0.5, max_streams=400, max_tokens=TOKENS
                )
            for level in LEVELS:
                measured = {t.name: await _measure(t, engine.pid, level) for t in targets}
                rows += _rows(level, measured)
            if PACE_MS > 0:
                paced = {
                    t.name: await _measure(t, engine.pid, TTFT_LEVEL, paced=True) for t in targets
                }
                rows += _rows(TTFT_LEVEL, paced, PACE_MS)
        finally:
            for process in reversed(started):
                process.terminate()
                process.wait(timeout=30)
    return rows


def _rows(
    level: int, measured: dict[str, tuple[LoadResult, Cpu, Cpu]], paced_ms: float = 0.0
) -> list[Row]:
    direct = measured.get("direct")
    rows = []
    for name, (result, proxy_cpu, engine_cpu) in measured.items():
        events = result.streams * EVENTS_PER_STREAM
        ttfts = result.ttfts_s
        added = None if direct is None or name == "direct" else direct[0].ttfts_s
        rows.append(
            Row(
                level=level,
                target=name,
                streams=result.streams,
                failures=result.failures,
                events_per_s=_rate(result),
                vs_direct=None if direct is None else _rate(result) / _rate(direct[0]),
                proxy_cpu_us_per_event=None if name == "direct" else proxy_cpu.total / events * 1e6,
                proxy_user_share=None
                if name == "direct" or not proxy_cpu.total
                else proxy_cpu.user / proxy_cpu.total,
                engine_cpu_us_per_event=engine_cpu.total / events * 1e6,
                ttft_p50_ms=_p(ttfts, 50) * 1e3,
                ttft_p99_ms=_p(ttfts, 99) * 1e3,
                added_ttft_p50_ms=None if added is None else (_p(ttfts, 50) - _p(added, 50)) * 1e3,
                added_ttft_p99_ms=None if added is None else (_p(ttfts, 99) - _p(added, 99)) * 1e3,
                paced_ms=paced_ms,
            )
        )
    return rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _report(rows: list[Row]) -> None:
    print(
        f"{TOKENS + 2} events per stream, {SECONDS:g} s per measurement, best of {ROUNDS}; "
        f"{os.cpu_count()} CPUs; proxy pinned to its own core; the sidecar on "
        f"{'asyncio' if serve_loop() is None else 'uvloop'}"
    )
    _table([r for r in rows if not r.paced_ms])
    if paced := [r for r in rows if r.paced_ms]:
        rate = TTFT_LEVEL * 1e3 / PACE_MS
        print(
            f"paced (latency below saturation): {TTFT_LEVEL} streams, one event every "
            f"{PACE_MS:g} ms each ({rate:,.0f} events/s in all), starts staggered, "
            f"{PACED_SECONDS:g} s"
        )
        _table(paced)
    _targets(rows)


def _table(rows: list[Row]) -> None:
    print(
        f"  {'streams':>7} {'target':8} {'events/s':>9} {'vs direct':>9} {'proxy us/ev':>11} "
        f"{'user':>4} {'engine us/ev':>12} {'TTFT p50':>9} {'p99':>7} {'added p50':>9} {'p99':>7}"
    )
    for r in rows:
        print(
            f"  {r.level:7d} {r.target:8} {r.events_per_s:9.0f} {_fmt(r.vs_direct, '9.2f')} "
            f"{_fmt(r.proxy_cpu_us_per_event, '11.1f')} {_share(r.proxy_user_share)} "
            f"{r.engine_cpu_us_per_event:12.1f} "
            f"{r.ttft_p50_ms:9.2f} {r.ttft_p99_ms:7.2f} {_fmt(r.added_ttft_p50_ms, '+9.2f')} "
            f"{_fmt(r.added_ttft_p99_ms, '+7.2f')}" + _failed(r.failures)
        )


def _share(share: float | None) -> str:
    return f"{share:4.0%}" if share is not None else f"{'-':>4}"


def _failed(count: int) -> str:
    return f"  ({count} failed)" if count else ""


def _targets(rows: list[Row]) -> None:
    """The sidecar against its targets, each against nginx in the same run."""
    found = {(r.level, r.target, r.paced_ms): r for r in rows}
    sidecar, nginx = found.get((TTFT_LEVEL, "sidecar", 0.0)), found.get((TTFT_LEVEL, "nginx", 0.0))
    if sidecar and nginx and sidecar.proxy_cpu_us_per_event and nginx.proxy_cpu_us_per_event:
        ratio = sidecar.proxy_cpu_us_per_event / nginx.proxy_cpu_us_per_event
        _verdict(
            f"CPU per relayed event at {TTFT_LEVEL} streams <= {CPU_VS_NGINX:g}x nginx",
            ratio <= CPU_VS_NGINX,
            f"{ratio:.2f}x ({sidecar.proxy_cpu_us_per_event:.1f} vs "
            f"{nginx.proxy_cpu_us_per_event:.1f} us)",
        )
    sidecar, nginx = (found.get((TTFT_LEVEL, name, PACE_MS)) for name in ("sidecar", "nginx"))
    if sidecar and nginx and sidecar.added_ttft_p50_ms is not None:
        assert nginx.added_ttft_p50_ms is not None
        limit = nginx.added_ttft_p50_ms + ADDED_TTFT_OVER_NGINX_MS
        _verdict(
            f"added TTFT p50 at {TTFT_LEVEL} streams, paced at {PACE_MS:g} ms <= nginx's "
            f"+ {ADDED_TTFT_OVER_NGINX_MS:g} ms",
            sidecar.added_ttft_p50_ms <= limit,
            f"{sidecar.added_ttft_p50_ms:+.2f} ms (nginx {nginx.added_ttft_p50_ms:+.2f} ms)",
        )


def _verdict(target: str, met: bool, measured: str) -> None:
    print(f"  {'PASS' if met else 'MISS'}  {target}: {measured}")


def _write_json(rows: list[Row]) -> None:
    JSON_PATH.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "cpus": os.cpu_count(),
        "seconds": SECONDS,
        "rounds": ROUNDS,
        "events_per_stream": EVENTS_PER_STREAM,
        "paced_ms": PACE_MS,
        "paced_seconds": PACED_SECONDS,
        "client_loop": "uvloop" if loop_factory() else "asyncio",
        "sidecar_loop": "asyncio" if serve_loop() is None else "uvloop",
        "sidecar_env": {k: v for k, v in os.environ.items() if k.startswith("SIDECAR_")},
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    JSON_PATH.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2))
    print(f"  written to {JSON_PATH}")


def main() -> None:
    rows = run(bench())
    _report(rows)
    _write_json(rows)


if __name__ == "__main__":
    main()
