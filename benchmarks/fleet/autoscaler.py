"""The autoscaler's shell around the pure HPA (hpa.py): Prometheus scraping each serving pod's
metric, KEDA's trigger over the sum, the HPA's sync loop; and the oracle that scales with the
load itself.

Intervals are cluster seconds (``clock()``), their real length divided by the time-scale
factor: the scrape (the PodMonitor's 15 s), the HPA's sync period (the controller's default 15 s)
and KEDA's pollingInterval (the ScaledObject's): KEDA's metrics server answers the HPA from the
value it polled last, as with ``useCachedMetrics``; without it KEDA queries at each sync, which is
the same while pollingInterval equals the sync period, as shipped.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.fleet.hpa import SYNC_PERIOD_S, History, Spec, decide, external_proposal
from benchmarks.fleet.pods import Fleet, Pod

SCRAPE_S = 15.0  # deploy/k8s/components/monitoring/podmonitor.yaml's interval


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick:
    """One sync as it was seen: the load, the fleet, the metric and the decision."""

    at: float
    share: float
    replicas: int
    serving: int
    value: float | None
    desired: int


def metric_value(text: str, name: str) -> float | None:
    """The sum of the samples of ``name`` in a /metrics text (None: not exported)."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples if not s.name.endswith("_created"))
    return None


def _tick(
    fleet: Fleet, share: Callable[[float], float], now: float, value: float | None, desired: int
) -> Tick:
    return Tick(
        at=now,
        share=share(now),
        replicas=fleet.replicas,
        serving=len(fleet.serving()),
        value=value,
        desired=desired,
    )


@dataclass(kw_only=True)
class Prometheus:
    """The last value scraped from each pod (a pod not answering keeps its last)."""

    metric: str
    latest: dict[str, float] = field(default_factory=dict)

    async def scrape(self, session: aiohttp.ClientSession, pod: Pod) -> None:
        try:
            async with session.get(pod.metrics) as response:
                value = metric_value(await response.text(), self.metric)
        except (aiohttp.ClientError, TimeoutError):
            return
        if value is not None:
            self.latest[pod.name] = value

    def total(self, pods: list[Pod]) -> float:
        """The trigger's query, ``sum(metric)`` over the pods Prometheus scrapes."""
        return sum(self.latest.get(p.name, 0.0) for p in pods)


async def scraping(fleet: Fleet, store: Prometheus, until: float) -> None:
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while fleet.clock() < until:
            await asyncio.gather(*(store.scrape(session, p) for p in fleet.serving()))
            await asyncio.sleep(SCRAPE_S / fleet.scale)


@dataclass(frozen=True, slots=True, kw_only=True)
class Trigger:
    """KEDA's Prometheus trigger: ``sum(metric)`` with an AverageValue ``threshold``."""

    metric: str
    threshold: float
    polling_s: float
    spec: Spec


async def keda(
    fleet: Fleet, trigger: Trigger, share: Callable[[float], float], until: float
) -> list[Tick]:
    """Scrape and scale until ``until``; one Tick a sync."""
    store = Prometheus(metric=trigger.metric)
    scraper = asyncio.create_task(scraping(fleet, store, until), name="scrape")
    ticks: list[Tick] = []
    history, polled, polled_at = History(), 0.0, -math.inf
    while (now := fleet.clock()) < until:
        if now - polled_at >= trigger.polling_s:
            polled, polled_at = store.total(fleet.serving()), now
        current = fleet.replicas
        proposal = external_proposal(polled, trigger.threshold, current, trigger.spec.tolerance)
        decision = decide(trigger.spec, history, now=now, current=current, proposal=proposal)
        history = decision.history
        ticks.append(_tick(fleet, share, now, polled, decision.desired))
        if decision.desired != current:
            await fleet.scale_to(decision.desired)
        await asyncio.sleep(SYNC_PERIOD_S / fleet.scale)
    await scraper
    return ticks


async def oracle(
    fleet: Fleet, spec: Spec, share: Callable[[float], float], until: float
) -> list[Tick]:
    """The replicas the load needs (one pod per pod's capacity), decided the instant it
    changes; its pods still take the start delay."""
    ticks: list[Tick] = []
    while (now := fleet.clock()) < until:
        needed = min(spec.max_replicas, max(spec.min_replicas, math.ceil(share(now) - 1e-9)))
        if needed != fleet.replicas or not ticks or now - ticks[-1].at >= SYNC_PERIOD_S:
            ticks.append(_tick(fleet, share, now, None, needed))
        if needed != fleet.replicas:
            await fleet.scale_to(needed)
        await asyncio.sleep(0.25)
    return ticks


async def static(fleet: Fleet, share: Callable[[float], float], until: float) -> list[Tick]:
    """No autoscaler: the fleet as it was made, sampled every sync period."""
    ticks: list[Tick] = []
    while (now := fleet.clock()) < until:
        ticks.append(_tick(fleet, share, now, None, fleet.replicas))
        await asyncio.sleep(SYNC_PERIOD_S / fleet.scale)
    return ticks
