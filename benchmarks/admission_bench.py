"""Cost per operation of the bulkhead: uncontended and contended admit+release, core alone.

``python -m benchmarks.admission_bench count KIND N`` only runs N operations of one kind
(COUNTED), for instructions_bench to count under callgrind: ``uncontended``, ``wired`` (as serve
wires it), ``contended`` and ``semaphore`` (asyncio's, the same load).

Prints ns/op and the ratio to the bare state machine, so the asyncio layer's share is visible,
p50/p99 per operation (uncontended: each op timed alone; contended: the gap between successive
releases, all tasks together, loop turns included), and the memory one queued waiter holds, with
BENCH_WAITERS (10,000) really queued in a Bulkhead, against bare tasks awaiting a future. Targets,
as PASS/MISS (best of 3 runs): uncontended <= 3 us, contended p99 <= 20 us, <= 8 KiB per
queued waiter. It runs on the loop ``sidecar serve`` would (SIDECAR_EVENT_LOOP; auto: uvloop where
installed).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from benchmarks.loops import run_as_serve
from sidecar.core.admission import Admission
from sidecar.core.decisions import Granted
from sidecar.core.errors import AdmissionRejectedError
from sidecar.entry.app import SidecarServer
from sidecar.entry.event_loop import running_loop_name
from sidecar.entry.settings import load_settings
from sidecar.limiter.bulkhead import Bulkhead

UNCONTENDED_OPS = 50_000
PERMITS = 8
TASKS = 4 * PERMITS
OPS_PER_TASK = 1_500
REPEATS = 3
WAITERS = int(os.environ.get("BENCH_WAITERS", "10000"))
WIRED_ENV = {
    "SIDECAR_UPSTREAM_URL": "http://127.0.0.1:9",
    "SIDECAR_CAPACITY_SOURCE": "static",
    "SIDECAR_MODEL": "qwen2.5-7b",
    "SIDECAR_VRAM_TOTAL": "80GiB",
    "SIDECAR_WEIGHTS": "15GiB",
}


def _bulkhead(limit: int) -> Bulkhead:
    return Bulkhead(limit=limit, max_queue=10 * TASKS, max_wait_s=60.0)


def wired_bulkhead() -> Bulkhead:
    """The bulkhead as ``sidecar serve`` builds it: its metrics observer included."""
    server = SidecarServer(load_settings(WIRED_ENV))
    server.bulkhead.resize(PERMITS)
    return server.bulkhead


def core_only() -> float:
    """ns per request+release on the synchronous state machine alone."""
    core = Admission(limit=PERMITS, max_queue=0)
    started = time.perf_counter_ns()
    for _ in range(UNCONTENDED_OPS):
        decision = core.request(1, "default")
        assert isinstance(decision, Granted)
        core.release(decision.ticket, "completed")
    return (time.perf_counter_ns() - started) / UNCONTENDED_OPS


async def uncontended(bulkhead: Bulkhead | None = None) -> tuple[float, list[int]]:
    """ns per ``async with admit()`` when a permit is always free; and each op's own ns."""
    bulkhead = bulkhead or _bulkhead(PERMITS)
    clock = time.perf_counter_ns
    each = [0] * UNCONTENDED_OPS
    started = clock()
    for i in range(UNCONTENDED_OPS):
        op = clock()
        async with bulkhead.admit():
            pass
        each[i] = clock() - op
    return (clock() - started) / UNCONTENDED_OPS, each


async def contended() -> tuple[float, int, list[int]]:
    """ns per admit+release with 4x more tasks than permits; how many had to wait; the gaps
    between successive releases (ns), the loop's time per operation as it went."""
    bulkhead = _bulkhead(PERMITS)
    elapsed, gaps = await _contend(bulkhead.admit)
    return elapsed / (TASKS * OPS_PER_TASK), bulkhead.snapshot().queued_total, gaps


async def contended_semaphore(ops: int = OPS_PER_TASK) -> list[int]:
    """The same load on asyncio's own Semaphore (unbounded queue, no timeout): for scale."""
    semaphore = asyncio.Semaphore(PERMITS)
    return (await _contend(lambda: semaphore, ops))[1]


async def _contend(
    admit: Callable[[], AbstractAsyncContextManager[object]], ops: int = OPS_PER_TASK
) -> tuple[int, list[int]]:
    """TASKS tasks, each ``ops`` times: admit, hold across a loop turn, release."""
    releases: list[int] = []
    mark = releases.append
    clock = time.perf_counter_ns

    async def worker() -> None:
        for _ in range(ops):
            async with admit():
                await asyncio.sleep(0)  # hold across a loop turn so the others queue
            mark(clock())

    started = clock()
    await asyncio.gather(*(worker() for _ in range(TASKS)))
    return clock() - started, [b - a for a, b in itertools.pairwise(releases)]


async def sleep_baseline() -> float:
    """ns per bare ``await asyncio.sleep(0)`` across the same tasks: the loop's own cost."""

    async def worker() -> None:
        for _ in range(OPS_PER_TASK):
            await asyncio.sleep(0)

    started = time.perf_counter_ns()
    await asyncio.gather(*(worker() for _ in range(TASKS)))
    return (time.perf_counter_ns() - started) / (TASKS * OPS_PER_TASK)


async def _hold_waiters(bulkhead: Bulkhead | None) -> tuple[Callable[[], None], list[Any]]:
    """WAITERS tasks parked: queued in ``bulkhead`` (one permit held), or on a bare future."""
    if bulkhead is None:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tasks = [asyncio.ensure_future(_await(gate)) for _ in range(WAITERS)]
        await asyncio.sleep(0)
        return lambda: gate.set_result(None), tasks
    tasks = [asyncio.ensure_future(_admit_once(bulkhead)) for _ in range(WAITERS)]
    await asyncio.sleep(0)  # each task's first step was scheduled before this one resumes
    assert bulkhead.snapshot().queued == WAITERS
    return bulkhead.drain, tasks


async def _await(gate: asyncio.Future[None]) -> None:
    await gate


async def _admit_once(bulkhead: Bulkhead) -> None:
    async with bulkhead.admit():
        pass


async def waiter_bytes(queued: bool, *, traced: bool) -> float:
    """Bytes per parked waiter: tracemalloc's count, or the RSS growth (/proc, Linux)."""
    bulkhead = Bulkhead(limit=1, max_queue=WAITERS, max_wait_s=600.0) if queued else None
    holder = bulkhead.admit() if bulkhead else None
    if holder is not None:
        await holder.__aenter__()
    gc.collect()
    before = tracemalloc.get_traced_memory()[0] if traced else _rss()
    release, tasks = await _hold_waiters(bulkhead)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if traced else _rss()
    release()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(r is None or isinstance(r, AdmissionRejectedError) for r in results)
    if holder is not None:
        await holder.__aexit__(None, None, None)
    return (after - before) / WAITERS


def _rss() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def _traced(main: Coroutine[Any, Any, float]) -> float:
    tracemalloc.start()
    try:
        return run_as_serve(main)
    finally:
        tracemalloc.stop()


async def _loop_name() -> str:
    return running_loop_name()


COUNTED = ("uncontended", "wired", "contended", "semaphore")


async def _uncontended_ops(bulkhead: Bulkhead, n: int) -> None:
    for _ in range(n):
        async with bulkhead.admit():
            pass


def count_ops(kind: str, n: int) -> None:
    """``n`` operations of ``kind`` and nothing else, on serve's loop: what callgrind counts."""
    per_task = max(1, n // TASKS)
    if kind == "uncontended":
        run_as_serve(_uncontended_ops(_bulkhead(PERMITS), n))
    elif kind == "wired":
        run_as_serve(_uncontended_ops(wired_bulkhead(), n))
    elif kind == "contended":
        run_as_serve(_contend(_bulkhead(PERMITS).admit, per_task))
    elif kind == "semaphore":
        run_as_serve(contended_semaphore(per_task))
    else:
        raise SystemExit(f"count: KIND is one of {', '.join(COUNTED)}, not {kind!r}")


def _p(values: list[int], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _verdict(target: str, met: bool, measured: str) -> None:
    print(f"  {'PASS' if met else 'MISS'}  {target}: {measured}")


def main() -> None:
    # Best of REPEATS, as timeit does: on a shared machine, the slower runs measure the neighbours.
    core_ns = min(core_only() for _ in range(REPEATS))
    plain_ns, each = min((run_as_serve(uncontended()) for _ in range(REPEATS)), key=lambda r: r[0])
    wired_ns = min(run_as_serve(uncontended(wired_bulkhead()))[0] for _ in range(REPEATS))
    busy_ns, waited, gaps = min(
        (run_as_serve(contended()) for _ in range(REPEATS)), key=lambda r: _p(r[2], 99)
    )
    loop_ns = min(run_as_serve(sleep_baseline()) for _ in range(REPEATS))
    semaphore_gaps = min(
        (run_as_serve(contended_semaphore()) for _ in range(REPEATS)), key=lambda g: _p(g, 99)
    )
    ops = TASKS * OPS_PER_TASK
    print(f"event loop: {run_as_serve(_loop_name())} (as serve runs it)")
    print(f"core request+release (sync)      {core_ns:9.0f} ns/op  ({UNCONTENDED_OPS} ops)")
    print(
        f"uncontended admit+release        {plain_ns:9.0f} ns/op  ({plain_ns / core_ns:.1f}x core)"
        f"  p50 {_p(each, 50):.0f} ns  p99 {_p(each, 99):.0f} ns"
    )
    print(
        f"  the same, as serve wires it  {wired_ns:9.0f} ns/op  (its metrics observer: "
        f"+{wired_ns - plain_ns:.0f} ns)"
    )
    print(
        f"contended admit+release          {busy_ns:9.0f} ns/op  "
        f"({TASKS} tasks on {PERMITS} permits, {ops} ops, {waited} queued first)"
        f"  p50 {_p(gaps, 50):.0f} ns  p99 {_p(gaps, 99):.0f} ns"
    )
    print(
        f"asyncio.Semaphore, same load      p50 {_p(semaphore_gaps, 50):.0f} ns  "
        f"p99 {_p(semaphore_gaps, 99):.0f} ns  (stdlib, no queue bound or timeout; for scale)"
    )
    print(
        f"event-loop turn alone            {loop_ns:9.0f} ns/op  "
        f"(bare sleep(0) in the same {TASKS} tasks, for scale)"
    )
    queued = _traced(waiter_bytes(queued=True, traced=True))
    bare = _traced(waiter_bytes(queued=False, traced=True))
    rss = run_as_serve(waiter_bytes(queued=True, traced=False))
    print(
        f"one queued waiter ({WAITERS} queued)  {queued:9.0f} B (tracemalloc)  "
        f"{rss:.0f} B (RSS growth); a bare task on a future: {bare:.0f} B"
    )
    _verdict("uncontended admit+release <= 3 us", plain_ns <= 3000, f"{plain_ns / 1e3:.2f} us")
    _verdict(
        "contended admit+release p99 <= 20 us",
        _p(gaps, 99) <= 20_000,
        f"{_p(gaps, 99) / 1e3:.2f} us",
    )
    _verdict(
        "memory per queued waiter <= 8 KiB",
        queued <= 8192 and rss <= 8192,
        f"{queued / 1024:.2f} KiB traced, {rss / 1024:.2f} KiB RSS",
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["count"]:
        count_ops(sys.argv[2], int(sys.argv[3]))
    else:
        main()
