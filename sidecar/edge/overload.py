"""The sidecar's own overload manager, in Envoy's manner: a resource monitor read every interval
(the process's resident memory against a configured limit, the event loop's lag), a pure function
from a reading to a level, and the level's actions on the proxy port. Past ``stop_accepting`` new
connections are refused (503 ``too_many_connections``); past ``shed`` the connections holding the
most bytes while doing the least (a head arriving, kept alive idle, or a request waiting on its
client) are closed, ``SHED_PER_TICK`` a tick, until the reading falls back.
"""

from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import structlog

log = structlog.get_logger(__name__)

Level = Literal["normal", "stop_accepting", "shed"]
TASK_NAME = "overload-monitor"
STATM = Path("/proc/self/statm")
# How often the monitor is read.
INTERVAL_S = 0.25
# Connections closed a tick at the shed level: at 4 ticks a second, 64 a second, enough to
# give back what a flood holds within seconds, few enough that one bad reading is no massacre.
SHED_PER_TICK = 16


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


def level_of(reading: Reading, thresholds: OverloadThresholds) -> Level:
    """The overload level a reading puts the sidecar at (pure)."""
    if thresholds.memory_bytes is not None:
        used = reading.rss_bytes / thresholds.memory_bytes
        if used >= thresholds.shed:
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

    def shed(self, count: int) -> int:
        """Close up to ``count`` connections, those holding most while doing least first; how
        many were closed."""


class OverloadManager:
    """Turns readings into the port's actions, and says when the level changes."""

    def __init__(self, thresholds: OverloadThresholds, port: Port) -> None:
        self.thresholds, self._port = thresholds, port
        self.level: Level = "normal"
        self.shed_total = 0

    def update(self, reading: Reading) -> Level:
        level = level_of(reading, self.thresholds)
        if level != self.level:
            event = log.info if level == "normal" else log.warning
            event(
                "overload_level",
                level=level,
                previous=self.level,
                rss_bytes=reading.rss_bytes,
                loop_lag_s=round(reading.loop_lag_s, 3),
            )
        self.level = level
        self._port.accepting = level == "normal"
        if level == "shed":
            self.shed_total += self._port.shed(SHED_PER_TICK)
        return level


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
