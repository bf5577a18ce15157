"""The engine's own account of a run: KV usage, running, waiting and preemptions over time.

Read from vLLM's ``/metrics`` every half second through ``prometheus_client.parser``.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

SERIES = {
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_preemptions": "preemptions",  # the counter's family name, without _total
}
PERIOD_S = 0.5


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    kv_usage: float
    running: float
    waiting: float
    preemptions: float


@dataclass(slots=True)
class Timeline:
    """Samples in time order; ``preempted_between`` reads the counter's growth."""

    samples: list[Sample] = field(default_factory=list)

    def preempted_between(self, start: float, end: float) -> float:
        inside = [s for s in self.samples if start <= s.at <= end]
        if len(inside) < 2:
            return 0.0
        return inside[-1].preemptions - inside[0].preemptions

    def mean(self, name: str, start: float, end: float) -> float:
        """The mean of the samples inside [start, end]; NaN if no scrape answered in time."""
        values = [getattr(s, name) for s in self.samples if start <= s.at <= end]
        return sum(values) / len(values) if values else math.nan


def parse(text: str, at: float) -> Sample:
    """One sample from a ``/metrics`` text (sums over the engine label)."""
    found = dict.fromkeys(SERIES.values(), 0.0)
    for family in text_string_to_metric_families(text):
        name = SERIES.get(family.name)
        if name is None:
            continue
        found[name] = sum(s.value for s in family.samples if not s.name.endswith("_created"))
    return Sample(at, **found)


async def watch(metrics_url: str, timeline: Timeline, until: float) -> None:
    """Append a sample every PERIOD_S until ``until`` (a missed scrape is skipped)."""
    timeout = aiohttp.ClientTimeout(total=5)  # an engine under overload answers slowly
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while (now := time.monotonic()) < until:
            try:
                async with session.get(metrics_url) as response:
                    timeline.samples.append(parse(await response.text(), now))
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(PERIOD_S)
