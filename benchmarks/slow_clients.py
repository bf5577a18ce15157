"""`make bench-slow-clients`: clients that never finish, against the sidecar, nginx and HAProxy.

Each proxy, fresh for each attack and at its defaults (the sidecar's `sidecar serve`, nginx as
:mod:`benchmarks.nginx_proxy` runs it: one worker, its stock timeouts; HAProxy as
:mod:`benchmarks.haproxy_proxy` runs it: one thread, Debian's default timeouts), stands in front of
the same emulated engine while Debian's ``slowhttptest`` holds ``SLOW_CONNECTIONS`` connections
from 127.0.0.1 with slow headers (slowloris), a slow body (R-U-Dead-Yet) or a slow read, or
:mod:`benchmarks.segment_flood` sends bodies in 1-byte TCP segments. Meanwhile a legitimate client
on 127.0.0.2 sends a completion every 0.25 s on a new connection (5 s to answer). Printed: the
attack's connections at most, the legitimate completions served and their latency, the proxy's
resident memory (/proc/<pid>/status VmRSS, every process of it, sampled every 0.1 s) before and at
peak, and its CPU seconds. The engine and the attackers run on the first core, the proxy and the
legitimate client on the others. About 6 minutes at the defaults.

    SLOW_CONNECTIONS  default 3000 (over the sidecar's per-address cap, 2,048)
    SLOW_SECONDS      default 20, each attack
    SLOW_ATTACKS      default none,headers,body,read,segments
    SLOW_PROXIES      default sidecar,nginx,haproxy (one not installed is skipped, with a line);
                      sidecar-b: another build's, SLOW_SIDECAR_B_PROGRAM
    SLOW_SIDECAR_B_PROGRAM  sidecar-b's program: another build's `sidecar` (e.g. main's), to
                      compare two builds in the same run
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from benchmarks import haproxy_proxy, nginx_proxy
from benchmarks.haproxy_proxy import haproxy_binary, start_haproxy
from benchmarks.nginx_proxy import nginx_binary, start_nginx, worker_pids
from benchmarks.overload import servers

CONNECTIONS = int(os.environ.get("SLOW_CONNECTIONS", "3000"))
SECONDS = float(os.environ.get("SLOW_SECONDS", "20"))
ATTACKS = os.environ.get("SLOW_ATTACKS", "none,headers,body,read,segments").split(",")
PROXIES = os.environ.get("SLOW_PROXIES", "sidecar,nginx,haproxy").split(",")
SIDECAR_B_PROGRAM = os.environ.get("SLOW_SIDECAR_B_PROGRAM") or None
ENGINE_FLAGS = ("--tokens-per-s", "0")
LEGIT_ADDRESS = "127.0.0.2"
LEGIT_EVERY_S = 0.25
LEGIT_TIMEOUT_S = 5.0
RAMP_S = 3.0  # the attack opens its connections before the legitimate client starts
COMPLETION = {"model": "emulated-llama", "prompt": "hi", "max_tokens": 4}
OUT = Path(".bench")

# slowhttptest's mode, target path and the flags of each attack (the connection count, rate and
# length are added): headers and bodies trickle a random 24-byte field or form pair every 5 s;
# the slow reader pipelines 10 GETs (slowhttptest's most) of the engine's 2.9 kB /metrics,
# advertises a 512-1,024 byte window and reads 32 bytes a second.
SLOWHTTPTEST = {
    "headers": ("/v1/models", ("-H", "-i", "5", "-x", "24")),
    "body": ("/v1/completions", ("-B", "-i", "5", "-x", "24", "-s", "65536")),
    "read": ("/metrics", ("-X", "-k", "10", "-n", "1", "-w", "512", "-y", "1024", "-z", "32")),
}


@dataclass
class Run:
    """One attack on one proxy, as measured."""

    proxy: str
    attack: str
    held: int = 0  # the attack's connections open at most
    opened: int = 0  # the attack's connections opened in all
    legit: list[float | None] = field(default_factory=list)  # seconds, None: not served
    rss_before_kib: int = 0
    rss_peak_kib: int = 0
    cpu_s: float = 0.0

    def row(self) -> str:
        served = [s for s in self.legit if s is not None]
        p50 = f"{statistics.median(served) * 1000:.0f}" if served else "-"
        slowest = f"{max(served) * 1000:.0f}" if served else "-"
        return (
            f"| {self.proxy} | {self.attack} | {self.held:,} | {self.opened:,} "
            f"| {len(served)}/{len(self.legit)} "
            f"| {p50} | {slowest} | {self.rss_before_kib / 1024:.0f} "
            f"| {self.rss_peak_kib / 1024:.0f} | {self.cpu_s:.1f} |"
        )


HEADER = (
    "| proxy | attack | attack's connections at most | opened | legit served | legit p50 ms "
    "| legit max ms | RSS before MiB | RSS peak MiB | proxy CPU s |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def cpu_s(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


async def legit(
    url: str,
    until: float,
    *,
    address: str = LEGIT_ADDRESS,
    every_s: float = LEGIT_EVERY_S,
    route: str = "/v1/completions",
    body: Mapping[str, object] = COMPLETION,
) -> list[float | None]:
    """``body`` to ``route`` every ``every_s`` from ``address``, each on a new connection, until
    ``until``: each one's latency, None where it was not a 200 within LEGIT_TIMEOUT_S."""
    connector = aiohttp.TCPConnector(local_addr=(address, 0), force_close=True, limit=0)
    timeout = aiohttp.ClientTimeout(total=LEGIT_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> float | None:
            started = time.monotonic()
            try:
                async with session.post(url + route, json=body) as response:
                    await response.read()
                    return time.monotonic() - started if response.status == 200 else None
            except (aiohttp.ClientError, TimeoutError):
                return None

        tasks = []
        while time.monotonic() < until:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(every_s)
        return list(await asyncio.gather(*tasks))


async def sample(run: Run, pids: list[int], until: float) -> None:
    while time.monotonic() < until:
        run.rss_peak_kib = max(run.rss_peak_kib, rss_kib(pids))
        await asyncio.sleep(0.1)


def attacker(attack: str, url: str, prefix: Path) -> subprocess.Popen[bytes] | None:
    """The attack's process, on the engine's core; None for no attack."""
    if attack == "none":
        return None
    host, port = url.removeprefix("http://").split(":")
    log = prefix.with_suffix(".log").open("wb")
    if attack == "segments":
        command = [sys.executable, "-m", "benchmarks.segment_flood", host, port,
                   str(CONNECTIONS), str(SECONDS)]  # fmt: skip
    else:
        path, flags = SLOWHTTPTEST[attack]
        command = ["slowhttptest", *flags, "-c", str(CONNECTIONS), "-r", "1000",
                   "-l", str(int(SECONDS)), "-u", url + path, "-g", "-o", str(prefix)]  # fmt: skip
    return subprocess.Popen(servers.on_engine_cpus(command), stdout=log, stderr=subprocess.STDOUT)


def connections(attack: str, prefix: Path) -> tuple[int, int]:
    """The attack's connections open at most, and opened in all: slowhttptest's statistics
    (each second's connected, pending and closed so far), or the flood's own count."""
    if attack == "segments":
        lines = prefix.with_suffix(".log").read_text().splitlines()
        count = json.loads(lines[-1]) if lines else {}
        return int(count.get("most", 0)), int(count.get("opened", 0))
    table = prefix.with_suffix(".csv")
    if not table.exists():
        return 0, 0
    with table.open() as rows:
        seconds = list(csv.DictReader(rows))
    if not seconds:
        return 0, 0
    last = seconds[-1]
    opened = sum(int(last[key]) for key in ("Closed", "Pending", "Connected"))
    return max(int(row["Connected"]) for row in seconds), opened


async def attack_one(run: Run, url: str, pids: list[int]) -> None:
    prefix = OUT / f"slow-{run.attack}-{run.proxy}"
    run.rss_before_kib = run.rss_peak_kib = rss_kib(pids)
    cpu_before = cpu_s(pids)
    process = attacker(run.attack, url, prefix)
    length = SECONDS if process is not None else SECONDS / 4
    end = time.monotonic() + length
    sampler = asyncio.create_task(sample(run, pids, end))
    await asyncio.sleep(min(RAMP_S, length / 2))
    run.legit = await legit(url, end)
    await sampler
    run.cpu_s = cpu_s(pids) - cpu_before
    if process is not None:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.terminate()
            process.wait()
        run.held, run.opened = connections(run.attack, prefix)


@contextlib.contextmanager
def proxy(name: str, engine_url: str, binary: str | None) -> Iterator[tuple[str, list[int]]]:
    """The proxy, started fresh: its URL and its processes' PIDs; stopped by PID."""
    if name in ("sidecar", "sidecar-b"):
        log = OUT / f"slow-{name}.log"
        program = SIDECAR_B_PROGRAM if name == "sidecar-b" else None
        with servers.sidecar_process(engine_url, None, log, program) as (process, url, _admin):
            yield url, [process.pid]
        return
    assert binary is not None
    engine_port = int(engine_url.rsplit(":", 1)[1])
    port = servers.free_port()
    with tempfile.TemporaryDirectory() as tmp:
        start = start_nginx if name == "nginx" else start_haproxy
        process = start(binary, Path(tmp), port, engine_port)
        try:
            url = f"http://127.0.0.1:{port}"
            servers.wait_ready(url + "/health", process, 30)
            workers = worker_pids(process.pid) if name == "nginx" else []
            yield url, [process.pid, *workers]
        finally:
            process.terminate()
            process.wait(10)


def binaries() -> dict[str, str | None] | None:
    """Each proxy's executable (None: the sidecar's own), those not installed left out with a
    line; None where nginx, the reference, or sidecar-b's program is missing."""
    found: dict[str, str | None] = {}
    for name in PROXIES:
        if name in ("sidecar", "sidecar-b"):
            if name == "sidecar-b" and SIDECAR_B_PROGRAM is None:
                print("sidecar-b needs SLOW_SIDECAR_B_PROGRAM: another build's `sidecar`")
                return None
            found[name] = None
        elif name == "nginx":
            found[name] = nginx_binary()
            if found[name] is None:
                print(nginx_proxy.INSTALL_HINT)
                return None
        elif name == "haproxy":
            binary = haproxy_binary()
            if binary is None:
                print(f"skipping haproxy: {haproxy_proxy.INSTALL_HINT}")
            else:
                found[name] = binary
        else:
            print(f"unknown proxy {name!r}: sidecar, sidecar-b, nginx or haproxy")
            return None
    return found


def main() -> int:
    if shutil.which("slowhttptest") is None:
        print("slowhttptest not found; install it with: apt-get install -y slowhttptest")
        return 1
    found = binaries()
    if found is None:
        return 1
    OUT.mkdir(exist_ok=True)
    servers.pin_clients()
    runs = []
    with servers.emulator(ENGINE_FLAGS, OUT / "slow-emulator.log") as engine_url:
        for attack in ATTACKS:
            for name, binary in found.items():
                with proxy(name, engine_url, binary) as (url, pids):
                    run = Run(name, attack)
                    asyncio.run(attack_one(run, url, pids))
                print(run.row(), flush=True)
                runs.append(run)
    print(f"\n{CONNECTIONS:,} attack connections, {SECONDS:g} s each\n{HEADER}")
    print("\n".join(run.row() for run in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
