"""Instructions per request and per relayed event, the sidecar beside nginx and two floors (the
pump, and the pump that parses each request: ``benchmarks/byte_pump.py``): counted, not timed, so
that one run can tell a 2% change apart on a machine whose CPU times move by 10-30%.

Each proxy runs under valgrind's callgrind, which counts every instruction the process executes
in user space (the interpreter and our code, or nginx's C). Instrumentation stays off until the
proxy is warm; then, for two stream lengths, BENCH_INSTR_STREAMS streams go through it one at a
time, counted between a zero and a dump (``callgrind_control``). A stream's count is
``a + b x events``: the two lengths give ``a``, the fixed cost of a request, and ``b``, the cost of
each relayed event. The engine paces its events (BENCH_INSTR_GAP_MS apart) so that each arrives
in a read of its own, as from a decoding engine, although the proxy runs ~50x slower under
valgrind.

What a proxy does while idle (the sidecar's control loop and timers) is counted first, over
IDLE_S with no traffic, and that rate times each window's length is taken off its count, so that
``a`` and ``b`` are what traffic costs. What the kernel does (the syscalls, about the same for
any relay) is not counted, so the ratios are those of the work each proxy adds in user space, not
of CPU time. The counts repeat to within about 2% between runs; a change's effect is the
difference of two runs.

The ``admission`` target counts the bulkhead alone the same way: ``admission_bench count`` runs
one kind of admit+release (uncontended, as serve wires it, contended, and asyncio's semaphore
under the same load) under callgrind twice, ADMISSION_OPS apart; the difference over the
difference in operations is one operation's count, start-up and all else taken off.

Needs valgrind (``apt-get install -y valgrind``); without it this says so and skips. Sizes:
BENCH_INSTR_STREAMS (30 per length), BENCH_INSTR_EVENTS (the two lengths in token events: 1,64;
the short one short, so that ``a`` carries little of ``b``'s error),
BENCH_INSTR_GAP_MS (5), BENCH_INSTR_TARGETS (sidecar,nginx,pump,parse,admission), BENCH_INSTR_JSON
(.bench/instructions.json), BENCH_INSTR_KEEP (a folder for each window's callgrind dump,
``TARGET.EVENTSev.callgrind``, none kept by default; ``benchmarks.callgrind_split`` reads them).
SIDECAR_* variables reach the sidecar, as in relay_bench.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import interpreter
from benchmarks.admission_bench import COUNTED, PERMITS, TASKS
from benchmarks.loops import run, serve_loop
from benchmarks.nginx_proxy import INSTALL_HINT, nginx_binary, start_nginx
from benchmarks.relay_bench import _cores, _free_port, _pinned, _ready, _sidecar_env, _start
from benchmarks.stream_client import HOST, chat_request, one_stream

STREAMS = int(os.environ.get("BENCH_INSTR_STREAMS", "30"))
SHORT, LONG = (int(n) for n in os.environ.get("BENCH_INSTR_EVENTS", "1,64").split(","))
GAP_MS = float(os.environ.get("BENCH_INSTR_GAP_MS", "5"))
TARGETS = os.environ.get("BENCH_INSTR_TARGETS", "sidecar,nginx,pump,parse,admission").split(",")
RELAYS = ("sidecar", "nginx", "pump", "parse")
ADMISSION_OPS = (1_600, 12_800)  # the two runs' operations: multiples of admission_bench.TASKS
JSON_PATH = Path(os.environ.get("BENCH_INSTR_JSON", ".bench/instructions.json"))
# Where each counted window's callgrind dump is kept (none by default): by C function,
# ``callgrind_annotate --inclusive=yes DUMP`` shows where a window's instructions went.
KEEP = Path(os.environ["BENCH_INSTR_KEEP"]) if os.environ.get("BENCH_INSTR_KEEP") else None
VALGRIND_HINT = "valgrind not found; install it with: apt-get install -y valgrind"
WARM_STREAMS = 10  # per length, before counting: first-request paths, caches, lazy imports
IDLE_S = 4.0  # how long the idle rate is counted
READY_S = 180.0  # startup under valgrind, instrumentation off: ~10-30 s on this machine
# What a relayed event is, the way relay_bench and the client count them: the role event, the
# token events, [DONE].
EXTRA_EVENTS = 2


@dataclass(frozen=True)
class Row:
    """One proxy: instructions over each length's streams, and what they split into."""

    target: str
    streams: int
    events: tuple[int, int]  # relayed events per stream, short and long
    instructions: tuple[int, int]  # counted over ``streams`` streams of each length, idle less
    per_request: float  # a
    per_event: float  # b
    idle_per_s: float  # instructions per second with no traffic


def _split(short: int, long: int, streams: int) -> tuple[float, float]:
    """``a`` and ``b`` from the counts of ``streams`` streams at each length."""
    n_short, n_long = SHORT + EXTRA_EVENTS, LONG + EXTRA_EVENTS
    per_event = (long - short) / streams / (n_long - n_short)
    return short / streams - per_event * n_short, per_event


def _callgrind(dump: Path | str, log: Path) -> list[str]:
    """valgrind's callgrind, writing its counts to ``dump`` and its own messages to ``log``."""
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dump}", f"--log-file={log}"]


def _summary(dump: Path) -> int | None:
    """The instructions a callgrind dump counted (its ``summary`` line), None until written."""
    for line in dump.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    return None


class Counted:
    """A process under callgrind, instrumentation off until ``start``; counts read by ``count``."""

    def __init__(self, name: str, out: Path) -> None:
        self.name = name
        self._out = out
        self.process: subprocess.Popen[bytes] | None = None

    def wrapper(self) -> list[str]:
        return [
            *_callgrind(self._out / f"{self.name}.%p", self._out / f"{self.name}.valgrind.log"),
            "--instr-atstart=no",
        ]

    def _control(self, *args: str) -> None:
        assert self.process is not None
        subprocess.run(
            ["callgrind_control", *args, str(self.process.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )

    def start(self) -> None:
        self._control("--instr=on")

    def zero(self) -> None:
        self._control("--zero")

    def count(self, keep_as: str | None = None) -> int:
        """Instructions since the last zero: the newest dump's ``summary`` line. Where KEEP is
        set, the dump is copied there as ``keep_as``, for callgrind_annotate."""
        before = set(self._out.glob(f"{self.name}.*.*"))
        self._control("--dump")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for dump in set(self._out.glob(f"{self.name}.*.*")) - before:
                if (counted := _summary(dump)) is not None:
                    if KEEP is not None and keep_as is not None:
                        KEEP.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(dump, KEEP / keep_as)
                    return counted
            time.sleep(0.1)
        raise RuntimeError(f"no callgrind dump from {self.name}")


async def _streams(port: int, events: int, count: int) -> None:
    """``count`` paced streams of ``events`` token events, one after another, one connection."""
    request = chat_request(HOST, port, events, GAP_MS, events=events)
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        for _ in range(count):
            await one_stream(reader, writer, request)
    finally:
        writer.close()


async def _measure(counted: Counted, port: int) -> Row:
    for events in (SHORT, LONG):
        await _streams(port, events, WARM_STREAMS)
    counted.start()
    counted.zero()
    began = time.monotonic()
    await asyncio.sleep(IDLE_S)
    idle_per_s = counted.count() / (time.monotonic() - began)
    totals = []
    for events in (SHORT, LONG):
        counted.zero()
        began = time.monotonic()
        await _streams(port, events, STREAMS)
        counted_now = counted.count(f"{counted.name}.{events}ev.callgrind")
        totals.append(round(counted_now - idle_per_s * (time.monotonic() - began)))
    short, long = totals
    per_request, per_event = _split(short, long, STREAMS)
    return Row(
        counted.name,
        STREAMS,
        (SHORT + EXTRA_EVENTS, LONG + EXTRA_EVENTS),
        (short, long),
        per_request,
        per_event,
        idle_per_s,
    )


def _launch(
    name: str, counted: Counted, engine_port: int, tmp: Path
) -> tuple[subprocess.Popen[bytes], int, int, str]:
    """Start ``name`` under callgrind: its process, the port to stream through, and the port and
    path that answer 200 once it is ready."""
    port = _free_port()
    if name == "sidecar":
        admin = _free_port()
        env = _sidecar_env(engine_port, port, admin) | {"PYTHONHASHSEED": "0"}
        args = [sys.executable, "-m", "sidecar", "serve"]
        return _start([*counted.wrapper(), *args], env), port, admin, "/readyz"
    if name in ("pump", "parse"):
        args = [sys.executable, "-m", "benchmarks.byte_pump", "--port", str(port)]
        args += ["--upstream-port", str(engine_port), *(["--parse"] if name == "parse" else [])]
        pump = _start([*counted.wrapper(), *args], {"PYTHONHASHSEED": "0"})
        return pump, port, port, "/health"
    binary = nginx_binary()
    assert binary is not None
    nginx = start_nginx(
        binary, tmp, port, engine_port, wrapper=counted.wrapper(), single_process=True
    )
    return nginx, port, port, "/health"


async def bench(names: list[str]) -> list[Row]:
    proxy_cores, engine_cores, client_cores = _cores()
    engine_port = _free_port()
    with _pinned(engine_cores):
        engine = _start([sys.executable, "-m", "benchmarks.sse_engine", "--port", str(engine_port)])
    rows = []
    with _pinned(client_cores), tempfile.TemporaryDirectory(prefix="instr-bench-") as tmp:
        try:
            await _ready(engine_port, "/health", engine)
            for name in names:
                counted = Counted(name, Path(tmp))
                with _pinned(proxy_cores):
                    process, port, ready_port, path = _launch(name, counted, engine_port, Path(tmp))
                counted.process = process
                try:
                    await _ready(ready_port, path, process, READY_S)
                    rows.append(await _measure(counted, port))
                finally:
                    process.terminate()
                    process.wait(timeout=60)
        finally:
            engine.terminate()
            engine.wait(timeout=30)
    return rows


def _counted_ops(kind: str, ops: int, out: Path) -> int:
    """Instructions of a whole ``admission_bench count`` process: start-up, then ``ops``."""
    dump = out / f"admission.{kind}.{ops}"
    count = [sys.executable, "-m", "benchmarks.admission_bench", "count", kind, str(ops)]
    subprocess.run(
        [*_callgrind(dump, out / f"admission.{kind}.{ops}.valgrind.log"), *count],
        check=True,
        env=os.environ | {"PYTHONHASHSEED": "0"},
        stdout=subprocess.DEVNULL,
        timeout=900,
    )
    counted = _summary(dump)
    if counted is None:
        raise RuntimeError(f"no summary in {dump}")
    return counted


def admission_counts() -> dict[str, float]:
    """Instructions per admit+release, by kind (admission_bench.COUNTED)."""
    small, large = ADMISSION_OPS
    # Two at a time (a count does not depend on what else runs): half the wait on two cores.
    with (
        tempfile.TemporaryDirectory(prefix="instr-admission-") as tmp,
        ThreadPoolExecutor(max_workers=2) as pool,
    ):
        runs = {
            (kind, ops): pool.submit(_counted_ops, kind, ops, Path(tmp))
            for kind in COUNTED
            for ops in ADMISSION_OPS
        }
        return {
            kind: (runs[kind, large].result() - runs[kind, small].result()) / (large - small)
            for kind in COUNTED
        }


def _report_admission(per_op: dict[str, float]) -> None:
    small, large = ADMISSION_OPS
    print(
        f"admission: user-space instructions per admit+release (callgrind; runs of {small:,} "
        f"and {large:,} operations, the difference), on "
        f"{'asyncio' if serve_loop() is None else 'uvloop'}"
    )
    notes = {
        "uncontended": "a permit always free",
        "wired": f"the same, as serve wires it: +{per_op['wired'] - per_op['uncontended']:,.0f} "
        "for its metrics observer",
        "contended": f"{TASKS} tasks on {PERMITS} permits, each queued first",
        "semaphore": f"asyncio.Semaphore, the same load: the bulkhead is "
        f"{per_op['contended'] / per_op['semaphore']:.2f}x",
    }
    for kind, count in per_op.items():
        print(f"  {kind:<12} {count:>9,.0f}  {notes[kind]}")


def _report(rows: list[Row]) -> None:
    print(
        f"user-space instructions (callgrind), {STREAMS} streams per length, one at a time, "
        f"events {GAP_MS:g} ms apart; stream = a + b x events; the sidecar and the pump on "
        f"{'asyncio' if serve_loop() is None else 'uvloop'}"
    )
    by = {row.target: row for row in rows}
    refs = [name for name in ("nginx", "pump", "parse") if name in by]
    head = "".join(f"  a vs {r:<5}  b vs {r:<5}" for r in refs)
    print(f"  {'target':<8} {'idle, per s':>12} {'a: per request':>15} {'b: per event':>13}{head}")
    for row in rows:
        line = f"  {row.target:<8} {row.idle_per_s:>12,.0f} {row.per_request:>15,.0f}"
        line += f" {row.per_event:>13,.0f}"
        for ref in refs:
            a, b = row.per_request / by[ref].per_request, row.per_event / by[ref].per_event
            line += f"  {a:9.2f}x  {b:9.2f}x"
        print(line)
    if "sidecar" in by and "nginx" in by:
        sidecar, nginx = by["sidecar"], by["nginx"]
        for events in (8 + EXTRA_EVENTS, 64 + EXTRA_EVENTS, 256 + EXTRA_EVENTS):
            ratio = (sidecar.per_request / events + sidecar.per_event) / (
                nginx.per_request / events + nginx.per_event
            )
            print(f"  per event over a {events}-event stream, sidecar / nginx: {ratio:.2f}x")


def _write_json(rows: list[Row], admission: dict[str, float] | None) -> None:
    JSON_PATH.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "interpreter": interpreter.build(),
        "sidecar_loop": "asyncio" if serve_loop() is None else "uvloop",
        "streams": STREAMS,
        "token_events": [SHORT, LONG],
        "gap_ms": GAP_MS,
        "sidecar_env": {k: v for k, v in os.environ.items() if k.startswith("SIDECAR_")},
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    body = {"meta": meta, "rows": [asdict(r) for r in rows], "admission_per_op": admission}
    JSON_PATH.write_text(json.dumps(body, indent=2))
    print(f"  written to {JSON_PATH}")


def main() -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print(f"  {VALGRIND_HINT}")
        return
    relays = [name for name in TARGETS if name in RELAYS]
    names = [name for name in relays if name != "nginx" or nginx_binary() is not None]
    if "nginx" in relays and "nginx" not in names:
        print(f"  {INSTALL_HINT}")
    rows = run(bench(names)) if names else []
    if rows:
        _report(rows)
    admission = admission_counts() if "admission" in TARGETS else None
    if admission is not None:
        _report_admission(admission)
    _write_json(rows, admission)


if __name__ == "__main__":
    main()
