"""The sidecar's own overload manager, in Envoy's manner: a resource monitor read every interval
(the process's resident memory against a configured limit, the event loop's lag), a pure function
from a reading to a level, and the level's actions on the proxy port. Past ``stop_accepting`` new
connections are refused (503 ``too_many_connections``) and each tick the connections doing the
least (a head arriving, kept alive idle, or a request waiting on its client) that hold the most
bytes are closed, the share of them that memory is over ``stop_accepting``: stopped alone, the
sidecar would refuse everyone while what fills it stays. Past ``shed``, at least
``SHED_PER_TICK`` a tick, until the reading is back under ``stop_accepting``. Past ``normal``,
the heap goes back to the system once a second.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, cast

import structlog

log = structlog.get_logger(__name__)

Level = Literal["normal", "stop_accepting", "shed"]
TASK_NAME = "overload-monitor"
STATM = Path("/proc/self/statm")
# How often the monitor is read: a flood of connections can take hundreds of MiB in a second.
INTERVAL_S = 0.1
# The fewest connections closed a tick at the shed level.
SHED_PER_TICK = 16
# Past normal, the heap is given back on the first tick and every this many after (once a
# second): a full collection of a large heap takes tens of milliseconds.
TRIM_TICKS = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class OverloadThresholds:
    """Where each action starts. ``memory_bytes``: what the resident set is measured against (the
    pod's limit), None: memory not watched; ``stop_accepting`` and ``shed`` are shares of it.
    ``loop_lag_s``: the event loop's lag past which new connections are refused, None: not
    watched (shedding does not give CPU back)."""

    memory_bytes: int | None = None
    stop_accepting: float = 0.90
    shed: float = 0.95
    loop_lag_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """What the resource monitor saw: resident bytes, and how late the loop ran its last tick."""

    rss_bytes: int
    loop_lag_s: float


def level_of(reading: Reading, thresholds: OverloadThresholds, previous: Level = "normal") -> Level:
    """The overload level a reading puts the sidecar at (pure). Shedding, once begun, goes on
    until memory is back under ``stop_accepting``: stopped between the two shares, the sidecar
    would refuse everyone while what fills it stays."""
    if thresholds.memory_bytes is not None:
        used = reading.rss_bytes / thresholds.memory_bytes
        if used >= thresholds.shed or (previous == "shed" and used >= thresholds.stop_accepting):
            return "shed"
        if used >= thresholds.stop_accepting:
            return "stop_accepting"
    lag = thresholds.loop_lag_s
    if lag is not None and reading.loop_lag_s >= lag:
        return "stop_accepting"
    return "normal"


class Port(Protocol):
    """The proxy port's connections, as the manager acts on them."""

    accepting: bool

    def shed(self, share: float, at_least: int) -> int:
        """Close ``share`` of the connections doing least (at least ``at_least`` of them), those
        holding most first; how many were closed."""


class OverloadManager:
    """Turns readings into the port's actions, and says when the level changes."""

    def __init__(
        self, thresholds: OverloadThresholds, port: Port, trim: Callable[[], None] | None = None
    ) -> None:
        self.thresholds, self._port = thresholds, port
        self._trim = trim or trim_heap
        self._since_trim = TRIM_TICKS  # ticks since the heap was last given back
        self.level: Level = "normal"
        self.shed_total = 0

    def update(self, reading: Reading) -> Level:
        level = level_of(reading, self.thresholds, self.level)
        if level != self.level:
            event = log.info if level == "normal" else log.warning
            event(
                "overload_level",
                overload=level,
                previous=self.level,
                rss_bytes=reading.rss_bytes,
                loop_lag_s=round(reading.loop_lag_s, 3),
            )
        self.level = level
        self._port.accepting = level == "normal"
        if level != "normal":
            at_least = SHED_PER_TICK if level == "shed" else 0
            self.shed_total += self._port.shed(self._excess(reading), at_least)
        if level == "normal":
            self._since_trim = TRIM_TICKS  # the next tick past normal gives the heap back
        elif self._since_trim >= TRIM_TICKS:
            self._since_trim = 0
            self._trim()
        else:
            self._since_trim += 1
        return level

    def _excess(self, reading: Reading) -> float:
        """The share of memory in use above ``stop_accepting``'s (0 where none is)."""
        limit = self.thresholds.memory_bytes
        if limit is None or reading.rss_bytes <= 0:
            return 0.0
        target = self.thresholds.stop_accepting * limit
        return max(0.0, (reading.rss_bytes - target) / reading.rss_bytes)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return cast(Callable[[int], int], ctypes.CDLL(None).malloc_trim)
    except (OSError, AttributeError):  # not glibc
        return None


MALLOC_TRIM = _malloc_trim()


def trim_heap() -> None:
    """Collect reference cycles, then give the heap's free pages back to the system (glibc's
    malloc_trim; Envoy's shrink_heap action). Both are needed: closed connections' buffers wait
    in cycles for a full collection, and once freed stay resident in glibc's heap (measured:
    2 x 1,024 slow readers gone, 1,029 MiB resident; after either alone still 1,021; after
    both, 91), so the resident size the monitor reads would never fall."""
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


def resident_bytes() -> int:
    """This process's resident memory now (/proc/self/statm; its peak where there is none)."""
    try:
        resident_pages = int(STATM.read_text(encoding="ascii").split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def start_watching(
    manager: OverloadManager, read_rss: Callable[[], int] | None = None
) -> asyncio.Task[None]:
    """:func:`watch` in a named task whose crash is logged, never silent."""
    task = asyncio.create_task(watch(manager, read_rss or resident_bytes), name=TASK_NAME)
    task.add_done_callback(_report_exit)
    return task


def _report_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("overload_monitor_died", error=repr(task.exception()))


async def watch(
    manager: OverloadManager,
    read_rss: Callable[[], int] = resident_bytes,
    interval_s: float = INTERVAL_S,
) -> None:
    """Read the monitor every ``interval_s`` (the loop's lag: how late the sleep ended) and hand
    the manager each reading; runs until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        manager.update(Reading(rss_bytes=read_rss(), loop_lag_s=max(0.0, loop.time() - due)))
