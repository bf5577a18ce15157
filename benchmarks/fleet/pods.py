"""The fleet's pods: a GPU-shaped emulated engine each, with a real `sidecar serve` in front or
the engine alone, created with a start delay and joined to the balancer once ready.

Times are the cluster's (``clock()``: the run's seconds times the time-scale factor), so a start
delay of 98-130 s and the HPA's windows shrink together. A pod that leaves is taken off the
balancer at once and stopped after ``drain_s`` real seconds (its streams run in real time).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.capacity_sweep import ENGINE_FLAGS
from benchmarks.fleet.balancer import Balancer
from benchmarks.overload import servers


def pod_flags(shrink: float, max_num_seqs: int) -> tuple[str, ...]:
    """capacity_sweep's Qwen2.5-14B on one H100 with ``1 / shrink`` of its KV pool and a
    sequence cap of ``max_num_seqs``: a pod whose requests take as long as on the H100 (the
    same prefill and decode speed) but that serves a handful of users, so that a fleet of
    several fits on two cores."""
    flags = list(ENGINE_FLAGS)
    kv = flags.index("--kv-tokens") + 1
    flags[kv] = str(round(int(flags[kv]) / shrink))
    flags[flags.index("--max-num-seqs") + 1] = str(max_num_seqs)
    return tuple(flags)


def engine_settings(flags: Sequence[str]) -> dict[str, str]:
    """What an operator who sets the engine's flags tells its sidecar too: its sequence cap
    (``--max-num-seqs``, which vLLM's metrics do not state), for the signal's slots term."""
    return {"engine_max_num_seqs": flags[flags.index("--max-num-seqs") + 1]}


@dataclass(eq=False, kw_only=True)
class Pod:
    """One pod's life in cluster seconds, and where it is reached."""

    name: str
    created: float
    ready_at: float | None = None
    leaving_at: float | None = None
    gone_at: float | None = None
    endpoint: str = ""  # host:port the balancer sends to
    metrics: str = ""  # the /metrics URL the autoscaler scrapes
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    processes: asyncio.Task[None] | None = None  # starting its processes (in a thread)
    started: asyncio.Task[None] | None = None  # until ready (or gone, if deleted first)

    @property
    def serving(self) -> bool:
        return self.ready_at is not None and self.leaving_at is None


@dataclass(kw_only=True)
class Fleet:
    """The Deployment: pods created and deleted to match a replica count."""

    flags: tuple[str, ...]
    sidecar: bool
    metrics_from: str  # "sidecar" or "engine": whose /metrics the autoscaler reads
    delays: Iterator[float]  # cluster seconds from a pod's creation to ready
    balancer: Balancer
    logs: Path
    clock: Callable[[], float]
    scale: float
    drain_s: float
    sidecar_settings: dict[str, str] = field(default_factory=dict)  # SIDECAR_* (lower case)
    pods: list[Pod] = field(default_factory=list)
    _names: Iterator[int] = field(default_factory=itertools.count)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _reloading: asyncio.Lock = field(default_factory=asyncio.Lock)  # one reload at a time

    @property
    def replicas(self) -> int:
        """spec.replicas: every pod not terminating, ready or not."""
        return sum(1 for p in self.pods if p.leaving_at is None)

    def serving(self) -> list[Pod]:
        return [p for p in self.pods if p.serving]

    def _processes(self, pod: Pod) -> None:
        log = self.logs / pod.name
        engine = pod.stack.enter_context(servers.emulator(self.flags, log.with_suffix(".engine")))
        pod.endpoint, pod.metrics = engine.removeprefix("http://"), engine + "/metrics"
        if self.sidecar:
            settings = {**engine_settings(self.flags), **self.sidecar_settings}
            front, admin = pod.stack.enter_context(
                servers.sidecar_ports(engine, None, log.with_suffix(".sidecar"), **settings)
            )
            pod.endpoint = front.removeprefix("http://")
            if self.metrics_from == "sidecar":
                pod.metrics = admin + "/metrics"

    async def _start(self, pod: Pod, delay: float) -> None:
        pod.processes = asyncio.create_task(asyncio.to_thread(self._processes, pod))
        await asyncio.shield(pod.processes)
        await asyncio.sleep(max(0.0, (pod.created + delay - self.clock()) / self.scale))
        if pod.leaving_at is not None:
            await asyncio.to_thread(pod.stack.close)
            pod.gone_at = self.clock()
            return
        pod.ready_at = self.clock()
        await self._rebalance()

    async def _rebalance(self) -> None:
        async with self._reloading:
            endpoints = [p.endpoint for p in self.serving()]
            await asyncio.to_thread(self.balancer.serve, endpoints)

    async def _stop(self, pod: Pod) -> None:
        await asyncio.sleep(self.drain_s)
        await asyncio.to_thread(pod.stack.close)
        pod.gone_at = self.clock()

    def _spawn(self, task: asyncio.Task[None]) -> asyncio.Task[None]:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def scale_to(self, replicas: int) -> None:
        """Create or delete pods until ``replicas`` are not terminating. Deleted first: pods
        not ready, then the most recently ready (as a ReplicaSet picks)."""
        now = self.clock()
        for _ in range(replicas - self.replicas):
            pod = Pod(name=f"pod-{next(self._names)}", created=now)
            self.pods.append(pod)
            pod.started = self._spawn(
                asyncio.create_task(self._start(pod, next(self.delays)), name=pod.name)
            )
        alive = [p for p in self.pods if p.leaving_at is None]
        alive.sort(key=lambda p: (p.ready_at is not None, -(p.ready_at or 0.0)))
        leaving = alive[: max(0, self.replicas - replicas)]
        for pod in leaving:
            pod.leaving_at = now
        if any(p.ready_at is not None for p in leaving):
            await self._rebalance()
        for pod in leaving:
            if pod.ready_at is not None:
                self._spawn(asyncio.create_task(self._stop(pod), name=f"stop-{pod.name}"))

    async def wait_ready(self) -> None:
        """Until every pod not terminating is ready."""
        await asyncio.gather(*(p.started for p in self.pods if p.started is not None))

    async def close(self) -> None:
        """Stop every pod now (the run is over)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pod in self.pods:
            if pod.processes is not None:
                with contextlib.suppress(Exception):
                    await pod.processes  # a start under way finishes before it is stopped
            await asyncio.to_thread(pod.stack.close)
            if pod.gone_at is None:
                pod.gone_at = self.clock()
