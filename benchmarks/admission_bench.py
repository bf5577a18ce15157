"""Cost per operation of the bulkhead: uncontended and contended admit+release, core alone.

Prints ns/op and the ratio to the bare state machine, so the asyncio layer's share is visible,
p50/p99 per operation (uncontended: each op timed alone; contended: from asking to being granted,
and the gap between successive releases, all tasks together, loop turns included), next to
asyncio.Semaphore on the same load, and the memory one queued waiter holds, with BENCH_WAITERS
(10,000) really queued in a Bulkhead, against bare tasks awaiting a future. The target,
PASS/MISS, best of 3 runs: contended admit-to-grant p99 <= 1.5x asyncio.Semaphore's on the same
load. It runs on the loop ``sidecar serve`` would (SIDECAR_EVENT_LOOP; auto: uvloop where
installed).
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.loops import run_as_serve
from sidecar.core.admission.decisions import Granted
from sidecar.core.admission.machine import Admission
from sidecar.core.errors import AdmissionRejectedError
from sidecar.core.limits import Limits
from sidecar.entry.app import SidecarServer
from sidecar.entry.event_loop import running_loop_name
from sidecar.entry.settings import load_settings
from sidecar.limiter.bulkhead import Bulkhead

UNCONTENDED_OPS = 50_000
PERMITS = 8
TASKS = 4 * PERMITS
OPS_PER_TASK = 1_500
REPEATS = 3
# The target: the bulkhead's contended admit-to-grant p99 against asyncio.Semaphore's.
GRANT_P99_VS_SEMAPHORE = 1.5
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
    server.bulkhead.resize(Limits(limit=PERMITS))
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


@dataclass(frozen=True)
class Contended:
    """One contended run: ns per op, how many had to wait, admit-to-grant and release gaps (ns)."""

    ns_per_op: float
    queued: int
    grants: list[int]
    gaps: list[int]


async def contended() -> Contended:
    """Admit+release with 4x more tasks than permits."""
    bulkhead = _bulkhead(PERMITS)
    elapsed, grants, gaps = await _contend(bulkhead.admit)
    return Contended(elapsed / len(grants), bulkhead.snapshot().queued_total, grants, gaps)


async def contended_semaphore() -> Contended:
    """The same load on asyncio's own Semaphore (unbounded queue, no timeout)."""
    semaphore = asyncio.Semaphore(PERMITS)
    elapsed, grants, gaps = await _contend(lambda: semaphore)
    return Contended(elapsed / len(grants), 0, grants, gaps)


async def _contend(
    admit: Callable[[], AbstractAsyncContextManager[object]],
) -> tuple[int, list[int], list[int]]:
    """TASKS tasks, each OPS_PER_TASK times: admit, hold across a loop turn, release. Returns
    the time it all took, each admit-to-grant and the gaps between successive releases."""
    grants: list[int] = []
    releases: list[int] = []
    clock = time.perf_counter_ns

    async def worker() -> None:
        for _ in range(OPS_PER_TASK):
            asked = clock()
            async with admit():
                grants.append(clock() - asked)
                await asyncio.sleep(0)  # hold across a loop turn so the others queue
            releases.append(clock())

    started = clock()
    await asyncio.gather(*(worker() for _ in range(TASKS)))
    return clock() - started, grants, [b - a for a, b in itertools.pairwise(releases)]


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


def _p(values: list[int], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _verdict(target: str, met: bool, measured: str) -> None:
    print(f"  {'PASS' if met else 'MISS'}  {target}: {measured}")


def main() -> None:
    # Best of REPEATS, as timeit does: on a shared machine, the slower runs measure the neighbours.
    core_ns = min(core_only() for _ in range(REPEATS))
    plain_ns, each = min((run_as_serve(uncontended()) for _ in range(REPEATS)), key=lambda r: r[0])
    wired_ns = min(run_as_serve(uncontended(wired_bulkhead()))[0] for _ in range(REPEATS))
    busy = min((run_as_serve(contended()) for _ in range(REPEATS)), key=lambda r: _p(r.grants, 99))
    loop_ns = min(run_as_serve(sleep_baseline()) for _ in range(REPEATS))
    semaphore = min(
        (run_as_serve(contended_semaphore()) for _ in range(REPEATS)),
        key=lambda r: _p(r.grants, 99),
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
        f"contended admit+release          {busy.ns_per_op:9.0f} ns/op  "
        f"({TASKS} tasks on {PERMITS} permits, {ops} ops, {busy.queued} queued first)"
    )
    for name, run in (("bulkhead", busy), ("asyncio.Semaphore", semaphore)):
        print(
            f"  {name:18} admit-to-grant p50 {_p(run.grants, 50):7.0f} ns  "
            f"p99 {_p(run.grants, 99):7.0f} ns;  between releases p50 {_p(run.gaps, 50):6.0f} ns"
            f"  p99 {_p(run.gaps, 99):6.0f} ns"
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
    ratio = _p(busy.grants, 99) / _p(semaphore.grants, 99)
    _verdict(
        f"contended admit-to-grant p99 <= {GRANT_P99_VS_SEMAPHORE:g}x asyncio.Semaphore's",
        ratio <= GRANT_P99_VS_SEMAPHORE,
        f"{ratio:.2f}x ({_p(busy.grants, 99) / 1e3:.1f} vs "
        f"{_p(semaphore.grants, 99) / 1e3:.1f} us)",
    )


if __name__ == "__main__":
    main()
