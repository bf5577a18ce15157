"""The loads a fleet is offered: a shape over time, in shares of one pod's capacity, and the
clients that follow it.

Shapes are piecewise linear in cluster seconds (compressed by the time-scale factor like every
interval), but for the burst, whose length is real seconds: it is defined by what one pod serves.

- closed loop: ``share x pod_users`` users, each sending its next streaming chat when the last
  ended and honouring busy answers' hints (``burst.one_user``, up to 8 retries);
- open loop: Poisson arrivals at ``share x pod_rate`` a second that never come back after a
  busy answer.

Every user and arrival draws its prompts from a generator seeded by the run's seed and its own
index, so each configuration is offered the same trace.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from benchmarks.burst import User, body, one_user
from benchmarks.capacity_sweep import MAX_TOKENS, MODEL, PROMPT_WORDS


@dataclass(frozen=True, slots=True)
class Segment:
    """``seconds`` of load going linearly from ``start`` to ``end`` (shares of one pod);
    ``real``: the seconds are wall-clock, not the cluster's."""

    seconds: float
    start: float
    end: float
    real: bool = False


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    segments: tuple[Segment, ...]
    step: tuple[int, int] | None = None  # the segments that are "the step" (TTFT p99)

    def bounds(self, scale: float) -> list[float]:
        """Each segment's start in cluster seconds, and the end of the last."""
        edges = [0.0]
        for s in self.segments:
            edges.append(edges[-1] + (s.seconds * scale if s.real else s.seconds))
        return edges

    def share(self, at: float, scale: float) -> float:
        """The load at cluster second ``at`` (0 after the end)."""
        edges = self.bounds(scale)
        for segment, begin, end in zip(self.segments, edges, edges[1:], strict=False):
            if begin <= at < end:
                return segment.start + (segment.end - segment.start) * (at - begin) / (end - begin)
        return 0.0


SHAPES = {
    "step": Shape("step", (Segment(120, 1, 1), Segment(600, 3, 3), Segment(900, 1, 1)), (1, 2)),
    "burst": Shape(
        "burst",
        (Segment(60, 0.25, 0.25), Segment(20, 1, 1, real=True), Segment(600, 0.25, 0.25)),
        (1, 2),
    ),
    "ramp": Shape(
        "ramp",
        (
            Segment(60, 0.25, 0.25),
            Segment(1200, 0.25, 3),
            Segment(1200, 3, 0.25),
            Segment(300, 0.25, 0.25),
        ),
        (1, 3),
    ),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Offered:
    """One user request as offered: when it began (cluster s) and how it went."""

    began: float
    user: User


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    shape: Shape
    open_loop: bool
    pod_users: int
    pod_rate: float
    seed: int


async def closed_loop(
    session: aiohttp.ClientSession, url: str, load: Load, clock: Callable[[], float], scale: float
) -> list[Offered]:
    """Users switched on while ``share x pod_users`` exceeds their index, until the end."""
    end = load.shape.bounds(scale)[-1]
    users = math.ceil(max(max(s.start, s.end) for s in load.shape.segments) * load.pod_users)
    done: list[Offered] = []

    async def user(index: int) -> None:
        rng = random.Random(f"{load.seed}-{index}")
        while (began := clock()) < end:
            if index >= round(load.shape.share(began, scale) * load.pod_users):
                await asyncio.sleep(0.1)
                continue
            got = await one_user(session, url, body(MODEL, PROMPT_WORDS, rng, MAX_TOKENS))
            done.append(Offered(began=began, user=got))

    await asyncio.gather(*(user(i) for i in range(users)))
    return done


def arrivals(load: Load, scale: float) -> list[float]:
    """Poisson arrival times (cluster s) at ``share x pod_rate`` a real second, by thinning."""
    rng = random.Random(load.seed)
    end = load.shape.bounds(scale)[-1]
    peak = max(max(s.start, s.end) for s in load.shape.segments) * load.pod_rate / scale
    times, at = [], 0.0
    while (at := at + rng.expovariate(peak)) < end:
        if rng.random() * peak <= load.shape.share(at, scale) * load.pod_rate / scale:
            times.append(at)
    return times


async def open_loop(
    session: aiohttp.ClientSession, url: str, load: Load, clock: Callable[[], float], scale: float
) -> list[Offered]:
    """Each arrival one attempt: a busy answer is final."""
    rng = random.Random(load.seed)
    tasks = []
    for at in arrivals(load, scale):
        await asyncio.sleep(max(0.0, (at - clock()) / scale))
        request = body(MODEL, PROMPT_WORDS, rng, MAX_TOKENS)
        tasks.append(asyncio.create_task(_one(session, url, request, clock())))
    return list(await asyncio.gather(*tasks))


async def _one(
    session: aiohttp.ClientSession, url: str, request: dict[str, object], began: float
) -> Offered:
    return Offered(began=began, user=await one_user(session, url, request, retries=0))


async def offer(url: str, load: Load, clock: Callable[[], float], scale: float) -> list[Offered]:
    """The whole trace through ``url``; returns every request offered."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        run = open_loop if load.open_loop else closed_loop
        return await run(session, url, load, clock, scale)


class Clock:
    """Cluster seconds: the run's real seconds since :meth:`restart` times ``scale``."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.origin = time.monotonic()

    def restart(self) -> None:
        self.origin = time.monotonic()

    def __call__(self) -> float:
        return (time.monotonic() - self.origin) * self.scale
