"""Where a request's Python goes, function by function: bytecodes executed, counted, not sampled.

callgrind counts instructions but cannot tell one Python function from another (all of them run
inside the interpreter's eval loop); cProfile times them but its own overhead distorts small
functions, and counts each resume of a coroutine as a call. This runs ``sidecar serve`` with a
trace function that counts every bytecode each code object executes (``f_trace_opcodes``), sends
it two runs of requests one at a time over one kept-alive connection, and takes the first run's
counts off the second's: what is left is per request, start-up excluded. Counts are
exact for what ran, and repeat within ~2% (PYTHONHASHSEED=0; how the engine's writes fall into
the sidecar's reads varies with timing, and the control loop's ticks fall into the runs); the
sidecar runs ~50x slower traced. Time per bytecode differs (a bytecode that calls into C costs what
that call costs), so this ranks the Python, and instructions_bench gives the totals.

Run: ``python -m benchmarks.bytecode_census [REQUESTS] [EVENTS]`` (200 requests of 1 token event
by default, after a first run a quarter as long). Prints bytecodes per request by phase (MARKS),
and bytecodes and frames entered per request by module and by function (those above 1% of the
bytecodes); writes JSON to BENCH_CENSUS_JSON (.bench/census.json). SIDECAR_* variables reach the
sidecar, as in relay_bench.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import os
import runpy
import sys
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from benchmarks.loops import run
from benchmarks.relay_bench import _free_port, _ready, _sidecar_env, _start
from benchmarks.stream_client import HOST, chat_request, one_stream

JSON_PATH = Path(os.environ.get("BENCH_CENSUS_JSON", ".bench/census.json"))
ROOT = str(Path(__file__).resolve().parent.parent) + os.sep
TRACED_READY_S = 120.0  # start-up traced takes ~50x as long


# Where a request's time to first byte is spent. MARKS: the frame (a qualified name) whose entry
# starts a phase -> (the phase it must follow, None for any; the phase it starts). A request's head
# starts the first; the request written to the engine ends it; the first write to the client ends
# the second (a response head sent alone, where the engine sent its own alone, is that first byte).
PHASES = ("to the engine", "the engine's answer to the first byte out", "after the first byte")
MARKS = {
    "Connection.on_message_begin": (None, 0),
    "EngineConnection.send": (None, 1),
    "StreamResponse.write_now": (1, 2),
    "StreamResponse._send": (1, 2),
}


def _traced_serve(out: str) -> None:
    """``sidecar serve`` with every bytecode and every entry into a frame (a call, or a coroutine
    resumed) counted by code object, and every bytecode by phase (PHASES); written to ``out`` at
    exit."""
    counts: collections.Counter[CodeType] = collections.Counter()
    entries: collections.Counter[CodeType] = collections.Counter()
    by_phase = [0] * len(PHASES)
    phase = [len(PHASES) - 1]  # start-up counts as after a request

    def local(frame: FrameType, event: str, _arg: object) -> Any:
        if event == "opcode":
            counts[frame.f_code] += 1
            by_phase[phase[0]] += 1
        return local

    def enter(frame: FrameType, _event: str, _arg: object) -> Any:
        entries[frame.f_code] += 1
        mark = MARKS.get(frame.f_code.co_qualname)
        if mark is not None and frame.f_code.co_filename.startswith(ROOT + "sidecar"):
            after, starts = mark
            if after is None or phase[0] == after:
                phase[0] = starts
        frame.f_trace_opcodes = True
        return local

    def dump() -> None:
        sys.settrace(None)
        named = {
            f"{code.co_filename.removeprefix(ROOT)}:{code.co_firstlineno}:{code.co_qualname}": (
                n,
                entries[code],
            )
            for code, n in counts.items()
        }
        Path(out).write_text(json.dumps({"functions": named, "phases": by_phase}))

    atexit.register(dump)
    sys.argv = ["sidecar", "serve"]
    sys.settrace(enter)
    runpy.run_module("sidecar", run_name="__main__")


async def _drive(requests: int, events: int, out: Path) -> None:
    """Start the engine and the traced sidecar, send ``requests`` one at a time, stop both."""
    engine_port, port, admin = _free_port(), _free_port(), _free_port()
    engine = _start(
        [sys.executable, "-m", "benchmarks.sse_engine", "--port", str(engine_port)],
    )
    env = _sidecar_env(engine_port, port, admin) | {"PYTHONHASHSEED": "0"}
    sidecar = _start([sys.executable, "-m", "benchmarks.bytecode_census", "serve", str(out)], env)
    try:
        await _ready(engine_port, "/health", engine)
        await _ready(admin, "/readyz", sidecar, TRACED_READY_S)
        reader, writer = await asyncio.open_connection(HOST, port)
        request = chat_request(HOST, port, events, events=events)
        for _ in range(requests):
            await one_stream(reader, writer, request)
        writer.close()
    finally:
        for process in (sidecar, engine):
            process.terminate()
            process.wait(timeout=120)


Counts = dict[str, tuple[float, float]]  # function -> (bytecodes, entries into its frames)


def _counts(requests: int, events: int, out: Path) -> tuple[Counts, list[int]]:
    run(_drive(requests, events, out))
    counted: dict[str, Any] = json.loads(out.read_text())
    functions = {name: (n, entered) for name, (n, entered) in counted["functions"].items()}
    return functions, counted["phases"]


def census(requests: int, events: int) -> tuple[Counts, list[float]]:
    """Bytecodes and frame entries per request by function, and bytecodes per request by phase:
    two runs, the first's counts taken off the second's."""
    small = max(1, requests // 4)
    tmp = JSON_PATH.parent
    tmp.mkdir(parents=True, exist_ok=True)
    first, phases0 = _counts(small, events, tmp / "census.small.json")
    second, phases = _counts(small + requests, events, tmp / "census.large.json")
    per_request = {}
    for name, (n, entered) in second.items():
        n0, entered0 = first.get(name, (0, 0))
        if n != n0:
            per_request[name] = ((n - n0) / requests, (entered - entered0) / requests)
    return per_request, [(b - a) / requests for a, b in zip(phases0, phases, strict=True)]


def _report(per_request: Counts, phases: list[float], requests: int, events: int) -> None:
    total = sum(n for n, _ in per_request.values())
    frames = sum(entered for _, entered in per_request.values())
    print(
        f"per request: {total:,.0f} bytecodes, {frames:,.0f} frames entered (calls and coroutine "
        f"resumes; {requests} requests of {events} token event(s), one at a time, over one "
        "connection)"
    )
    print(f"  {'bytecodes':>9}  {'share':>5}  by phase of the request:")
    for name, n in zip(PHASES, phases, strict=True):
        print(f"  {n:>9,.0f}  {n / total:>5.1%}  {name}")
    modules: dict[str, tuple[float, float]] = {}
    for name, (n, entered) in per_request.items():
        module = name.split(":", 1)[0]
        m, e = modules.get(module, (0.0, 0.0))
        modules[module] = (m + n, e + entered)
    print(f"  {'bytecodes':>9}  {'share':>5}  {'frames':>6}  by module, above 1%:")
    for module, (n, entered) in sorted(modules.items(), key=lambda item: -item[1][0]):
        if n >= total / 100:
            print(f"  {n:>9,.0f}  {n / total:>5.1%}  {entered:>6.1f}  {module}")
    print(f"  {'bytecodes':>9}  {'share':>5}  {'frames':>6}  by function, above 1%:")
    for name, (n, entered) in sorted(per_request.items(), key=lambda item: -item[1][0]):
        if n < total / 100:
            break
        print(f"  {n:>9,.0f}  {n / total:>5.1%}  {entered:>6.1f}  {name}")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        _traced_serve(args[1])
        return
    requests = int(args[0]) if args else 200
    events = int(args[1]) if len(args) > 1 else 1
    per_request, phases = census(requests, events)
    _report(per_request, phases, requests, events)
    written = {"functions": per_request, "phases": dict(zip(PHASES, phases, strict=True))}
    JSON_PATH.write_text(json.dumps(written, indent=1, sort_keys=True))
    print(f"  written to {JSON_PATH}")


if __name__ == "__main__":
    main()
