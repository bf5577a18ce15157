"""Cost per operation of the bulkhead: uncontended and contended admit+release, core alone.

Prints ns/op and the ratio to the bare state machine, so the asyncio layer's share is visible.
"""

from __future__ import annotations

import asyncio
import time

from sidecar.core.admission import Admission, Granted
from sidecar.limiter.bulkhead import Bulkhead

UNCONTENDED_OPS = 50_000
PERMITS = 8
TASKS = 4 * PERMITS
OPS_PER_TASK = 1_500


def _bulkhead(limit: int) -> Bulkhead:
    return Bulkhead(limit=limit, max_queue=10 * TASKS, max_wait_s=60.0)


def core_only() -> float:
    """ns per request+release on the synchronous state machine alone."""
    core = Admission(limit=PERMITS, max_queue=0)
    started = time.perf_counter_ns()
    for _ in range(UNCONTENDED_OPS):
        decision = core.request(1, "default")
        assert isinstance(decision, Granted)
        core.release(decision.ticket, "completed")
    return (time.perf_counter_ns() - started) / UNCONTENDED_OPS


async def uncontended() -> float:
    """ns per ``async with admit()`` when a permit is always free."""
    bulkhead = _bulkhead(PERMITS)
    started = time.perf_counter_ns()
    for _ in range(UNCONTENDED_OPS):
        async with bulkhead.admit():
            pass
    return (time.perf_counter_ns() - started) / UNCONTENDED_OPS


async def contended() -> tuple[float, int]:
    """ns per admit+release with 4x more tasks than permits; also how many had to wait."""
    bulkhead = _bulkhead(PERMITS)

    async def worker() -> None:
        for _ in range(OPS_PER_TASK):
            async with bulkhead.admit():
                await asyncio.sleep(0)  # hold across a loop turn so the others queue

    started = time.perf_counter_ns()
    await asyncio.gather(*(worker() for _ in range(TASKS)))
    elapsed = time.perf_counter_ns() - started
    return elapsed / (TASKS * OPS_PER_TASK), bulkhead.snapshot().queued_total


async def sleep_baseline() -> float:
    """ns per bare ``await asyncio.sleep(0)`` across the same tasks: the loop's own cost."""

    async def worker() -> None:
        for _ in range(OPS_PER_TASK):
            await asyncio.sleep(0)

    started = time.perf_counter_ns()
    await asyncio.gather(*(worker() for _ in range(TASKS)))
    return (time.perf_counter_ns() - started) / (TASKS * OPS_PER_TASK)


def main() -> None:
    core_ns = core_only()
    plain_ns = asyncio.run(uncontended())
    busy_ns, waited = asyncio.run(contended())
    loop_ns = asyncio.run(sleep_baseline())
    ops = TASKS * OPS_PER_TASK
    print(f"core request+release (sync)      {core_ns:9.0f} ns/op  ({UNCONTENDED_OPS} ops)")
    print(
        f"uncontended admit+release        {plain_ns:9.0f} ns/op  ({plain_ns / core_ns:.1f}x core)"
    )
    print(
        f"contended admit+release          {busy_ns:9.0f} ns/op  "
        f"({TASKS} tasks on {PERMITS} permits, {ops} ops, {waited} queued first)"
    )
    print(
        f"event-loop turn alone            {loop_ns:9.0f} ns/op  "
        f"(bare sleep(0) in the same {TASKS} tasks, for scale)"
    )
