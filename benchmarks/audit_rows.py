"""`make bench-audit`: issue 48's audit, "bounded against clients that never read", row by row.

For each row a fresh emulated engine (``--tokens-per-s 0``) and a fresh `sidecar serve` at its
defaults; :mod:`benchmarks.audit_attacks` runs the row's attack, in a process of its own on the
engine's core, for AUDIT_SECONDS, while a legit client on 127.0.0.9 and one on the attacker's own
address (127.0.0.2) each send a small chat completion every 0.5 s on a new connection (5 s to
answer). Before the attack the same clients measure the row's baseline for 2 s. The sidecar's
VmRSS is sampled every 0.25 s throughout; the engine's http_requests_total tells how many chat
completions reached it (row 2). Prints a table row per row, every target's PASS or MISS, and
writes .bench/audit.json and .bench/audit.md (docs/lab/reliability.md).

    AUDIT_ROWS     default 1,2,3,4,5
    AUDIT_SCALE    default 1.0; multiplies every width (connections, requests pipelined)
    AUDIT_SECONDS  default 20, each attack
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks import slow_clients
from benchmarks.audit_attacks import ATTACKER, MODEL, ROWS
from benchmarks.audit_report import Latencies, Measured, as_json, markdown, table_row
from benchmarks.overload import servers
from benchmarks.slow_clients import rss_kib

RUN_ROWS = [int(row) for row in os.environ.get("AUDIT_ROWS", "1,2,3,4,5").split(",")]
SCALE = float(os.environ.get("AUDIT_SCALE", "1.0"))
SECONDS = float(os.environ.get("AUDIT_SECONDS", "20"))
ENGINE_FLAGS = ("--tokens-per-s", "0")
OTHER_ADDRESS = "127.0.0.9"
LEGIT_EVERY_S = 0.5  # each legit request waits 5 s at most (slow_clients.LEGIT_TIMEOUT_S)
BASELINE_S = 2.0
RAMP_S = min(3.0, SECONDS / 4)  # the attack opens its connections before the legit clients start
SAMPLE_EVERY_S = 0.25
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
CHATS_ROUTE = "/v1/chat/completions"
OUT = Path(".bench")


async def legit(url: str, address: str, until: float) -> Latencies:
    """A chat completion every LEGIT_EVERY_S from ``address``, each on a new connection."""
    served = await slow_clients.legit(
        url, until, address=address, every_s=LEGIT_EVERY_S, route=CHATS_ROUTE, body=CHAT
    )
    return tuple(served)


async def both(url: str, until: float) -> tuple[Latencies, Latencies]:
    """The legit clients, on another address and on the attacker's."""
    other, own = await asyncio.gather(legit(url, OTHER_ADDRESS, until), legit(url, ATTACKER, until))
    return other, own


async def peak_rss_mib(pid: int, done: asyncio.Event) -> float:
    peak = 0
    while not done.is_set():
        peak = max(peak, rss_kib([pid]))
        await asyncio.sleep(SAMPLE_EVERY_S)
    return peak / 1024


def chats_received(engine_url: str) -> int:
    """Chat completions the engine has received, by its http_requests_total."""
    with urllib.request.urlopen(engine_url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return round(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "http_requests"
            for sample in family.samples
            if sample.name == "http_requests_total" and sample.labels["handler"] == CHATS_ROUTE
        )
    )


async def settled(engine_url: str) -> int:
    """:func:`chats_received`, once it has not moved for a second (at most 10 s)."""
    seen = await asyncio.to_thread(chats_received, engine_url)
    for _ in range(10):
        await asyncio.sleep(1.0)
        now = await asyncio.to_thread(chats_received, engine_url)
        if now == seen:
            break
        seen = now
    return seen


async def attacked(row: int, url: str) -> tuple[int, int, dict[str, int]]:
    """The row's attack, run to its end: what :mod:`benchmarks.audit_attacks` printed."""
    host, port = url.removeprefix("http://").split(":")
    command = [sys.executable, "-m", "benchmarks.audit_attacks", str(row), host, port]
    command += [str(SCALE), str(SECONDS)]
    with (OUT / f"audit-attack-{row}.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *servers.on_engine_cpus(command), stdout=asyncio.subprocess.PIPE, stderr=log
        )
        try:
            async with asyncio.timeout(SECONDS + 30):
                out, _ = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            return 0, 0, {"attack overran": 1}
    lines = out.decode().splitlines()
    count = json.loads(lines[-1]) if lines else {}
    ended = {str(how): int(n) for how, n in count.get("ended", {}).items()}
    return int(count.get("opened", 0)), int(count.get("most", 0)), ended


async def measure(row: int, engine_url: str, url: str, pid: int) -> Measured:
    done = asyncio.Event()
    sampler = asyncio.create_task(peak_rss_mib(pid, done))
    quiet = await both(url, time.monotonic() + BASELINE_S)
    baseline = [s for latencies in quiet for s in latencies if s is not None]
    before = await asyncio.to_thread(chats_received, engine_url)
    attack = asyncio.create_task(attacked(row, url))
    await asyncio.sleep(RAMP_S)
    other, own = await both(url, time.monotonic() + SECONDS - RAMP_S)
    opened, most, ended = await attack
    after = await settled(engine_url)
    done.set()
    legit_served = sum(s is not None for s in (*other, *own))
    return Measured(
        row=row,
        attack=ROWS[row].name,
        opened=opened,
        most=most,
        other=other,
        own=own,
        baseline_s=statistics.median(baseline) if baseline else None,
        rss_peak_mib=await sampler,
        ended=ended,
        engine_requests=after - before - legit_served if row == 2 else None,
    )


def run(row: int) -> Measured:
    """One row, on an engine and a sidecar of its own."""
    with (
        servers.emulator(ENGINE_FLAGS, OUT / f"audit-emulator-{row}.log") as engine_url,
        servers.sidecar_process(engine_url, None, OUT / f"audit-sidecar-{row}.log") as (
            process,
            url,
            _admin,
        ),
    ):
        return asyncio.run(measure(row, engine_url, url, process.pid))


def main() -> int:
    OUT.mkdir(exist_ok=True)
    servers.pin_clients()
    heading = f"Issue 48 audit: width x{SCALE:g}, {SECONDS:g} s each attack"
    print(heading, flush=True)
    measured = []
    for row in RUN_ROWS:
        measured.append(run(row))
        print(table_row(measured[-1]), flush=True)
    report = markdown(measured, heading)
    print("\n" + report, end="")
    (OUT / "audit.md").write_text(report)
    document = {"scale": SCALE, "seconds": SECONDS, "rows": [as_json(m) for m in measured]}
    (OUT / "audit.json").write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
