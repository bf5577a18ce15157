"""`make bench-fleet`: a fleet that scales on a signal, side by side on the same trace.

Pods are capacity_sweep's GPU-shaped emulated engine (Qwen2.5-14B in BF16 on an H100; prefill
and decode cost from the H100's published BF16 peak, see benchmarks/capacity_sweep.py), with
``1 / FLEET_POD_SHRINK`` of its KV pool and ``--max-num-seqs FLEET_POD_SEQS`` so that one pod
serves a handful of users at the H100's speed, each with a real `sidecar serve` (its defaults,
and SIDECAR_ENGINE_MAX_NUM_SEQS set to the pod's cap, as its operator would) in front or alone;
nginx balances over the ready pods (reloaded as they come and go); the autoscaler is the HPA
algorithm (hpa.py) on KEDA's trigger, bounds and behavior read from deploy/k8s at run time
(manifests.py). Every interval (scrape, sync, pollingInterval, windows, policy periods, the pod
start delay, the sidecars' signal windows) is in cluster seconds, run FLEET_TIME_SCALE times
faster.

Configurations (FLEET_CONFIGS): a: sidecar + the ScaledObject's own trigger (sidecar_utilisation,
its threshold); b: engine alone + vllm:num_requests_waiting AverageValue 5; c: engine alone +
vllm:kv_cache_usage_perc AverageValue 0.8; d: sidecar, a static fleet at maxReplicas; e: sidecar +
b's trigger; oracle: sidecar, the replicas the load needs decided at the instant it changes.
Cases (FLEET_CASES): step, burst, ramp, each -closed (users honouring busy answers) or -open
(arrivals that do not come back). Writes .bench/fleet.json, .bench/fleet.md, .bench/fleet.png.

    FLEET_CASES          default step-closed,burst-closed,ramp-closed,step-open
    FLEET_CONFIGS        default a,b,c,d,e,oracle
    FLEET_REPETITIONS    default 1 (the median of the repetitions is reported)
    FLEET_TIME_SCALE     default 10
    FLEET_START_S        a pod's start delay, cluster s, uniform in LOW-HIGH (default 98-130)
    FLEET_POD_SHRINK     the pod's KV pool, 1/this of the H100's (default 4)
    FLEET_POD_SEQS       the pod's --max-num-seqs (default 8)
    FLEET_POD_USERS      one pod's capacity in closed-loop users (default 8: within the
                         objectives alone, 10 are not)
    FLEET_POD_RATE       one pod's capacity in open-loop arrivals a second (default 2)
    FLEET_BALANCE        round-robin (a Service) or least-conn (a gateway)
    FLEET_DRAIN_S        real seconds a leaving pod drains before it stops (default 10)
    FLEET_SEED           default 47
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.burst import TTFT_S
from benchmarks.fleet import autoscaler, loads, report
from benchmarks.fleet.balancer import Balancer
from benchmarks.fleet.manifests import read_keda
from benchmarks.fleet.pods import Fleet, pod_flags
from benchmarks.overload import servers
from sidecar.core.laws.saturation import SaturationConfig

CASES = os.environ.get("FLEET_CASES", "step-closed,burst-closed,ramp-closed,step-open").split(",")
CONFIGS = os.environ.get("FLEET_CONFIGS", "a,b,c,d,e,oracle").split(",")
REPETITIONS = int(os.environ.get("FLEET_REPETITIONS", "1"))
SCALE = float(os.environ.get("FLEET_TIME_SCALE", "10"))
START_S = tuple(float(s) for s in os.environ.get("FLEET_START_S", "98-130").split("-"))
SHRINK = float(os.environ.get("FLEET_POD_SHRINK", "4"))
POD_SEQS = int(os.environ.get("FLEET_POD_SEQS", "8"))
POD_USERS = int(os.environ.get("FLEET_POD_USERS", "8"))
POD_RATE = float(os.environ.get("FLEET_POD_RATE", "2.0"))
BALANCE = os.environ.get("FLEET_BALANCE", "round-robin")
DRAIN_S = float(os.environ.get("FLEET_DRAIN_S", "10"))
SEED = int(os.environ.get("FLEET_SEED", "47"))
OUT = Path(".bench")


def signal_settings(scale: float) -> dict[str, str]:
    """The scale-out signal's windows in cluster seconds, as every other interval here: its
    defaults divided by the time-scale factor (the streams themselves run in real time, so a
    window holds ``scale`` times fewer of them than on a cluster)."""
    config = SaturationConfig()
    return {
        f"utilisation_{name}": f"{getattr(config, name) / scale:g}"
        for name in ("window_s", "floor_window_s")
    }


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    label: str
    sidecar: bool
    scaler: str  # keda, static or oracle
    metric: str = ""
    threshold: float = 0.0
    metrics_from: str = "engine"


def configs() -> dict[str, Config]:
    shipped = read_keda()
    waiting = "vllm:num_requests_waiting"  # the common recipe: AverageValue 5 a replica
    return {
        "a": Config(
            label="a sidecar+utilisation",
            sidecar=True,
            scaler="keda",
            metric=shipped.metric,
            threshold=shipped.threshold,
            metrics_from="sidecar",
        ),
        "b": Config(
            label="b alone+waiting", sidecar=False, scaler="keda", metric=waiting, threshold=5.0
        ),
        "c": Config(
            label="c alone+kv",
            sidecar=False,
            scaler="keda",
            metric="vllm:kv_cache_usage_perc",
            threshold=0.8,
        ),
        "d": Config(label="d static max", sidecar=True, scaler="static"),
        "e": Config(
            label="e sidecar+waiting", sidecar=True, scaler="keda", metric=waiting, threshold=5.0
        ),
        "oracle": Config(label="oracle", sidecar=True, scaler="oracle"),
    }


def delays(seed: int) -> Iterator[float]:
    rng = random.Random(seed)
    while True:
        yield rng.uniform(START_S[0], START_S[-1])


def oracle_limit(shape: loads.Shape, start_s: float) -> float:
    """The attainment the start delay allows at best: the share of the offered load above the
    pods an oracle has ready (those it asked for ``start_s`` earlier), counted as lost."""
    end = shape.bounds(SCALE)[-1]
    offered = lost = 0.0
    for at in itertools.takewhile(lambda t: t < end, itertools.count(0.0)):
        share = shape.share(at, SCALE)
        earlier = shape.share(max(0.0, at - start_s), SCALE)
        ready = max(1, min(math.ceil(share - 1e-9), math.ceil(earlier - 1e-9)))
        offered += share
        lost += max(0.0, share - ready)
    return 1 - lost / offered


def scaler(
    config: Config, fleet: Fleet, share: Callable[[float], float], end: float
) -> Coroutine[Any, Any, list[autoscaler.Tick]]:
    """The configuration's autoscaler, on the shipped ScaledObject's bounds and behavior."""
    shipped = read_keda()
    if config.scaler == "oracle":
        return autoscaler.oracle(fleet, shipped.spec, share, end)
    if config.scaler == "static":
        return autoscaler.static(fleet, share, end)
    trigger = autoscaler.Trigger(
        metric=config.metric,
        threshold=config.threshold,
        polling_s=shipped.polling_s,
        spec=shipped.spec,
    )
    return autoscaler.keda(fleet, trigger, share, end)


async def warm(fleet: Fleet, config: Config, shape: loads.Shape, seed: int) -> None:
    """The fleet the trace starts on, ready (no start delay), its clock then restarted."""
    spec = read_keda().spec
    initial = {"static": spec.max_replicas, "oracle": math.ceil(shape.share(0, SCALE))}
    fleet.delays = itertools.repeat(0.0)
    await fleet.scale_to(initial.get(config.scaler, spec.min_replicas))
    await fleet.wait_ready()
    fleet.delays = delays(seed)
    assert isinstance(fleet.clock, loads.Clock)
    fleet.clock.restart()
    for pod in fleet.pods:
        pod.created = pod.ready_at = 0.0


def record(
    fleet: Fleet, ticks: list[autoscaler.Tick], offered: list[loads.Offered]
) -> dict[str, Any]:
    """What a run leaves: every sync, every pod's life, every request offered."""
    pods = [
        {
            "name": p.name,
            "created": p.created,
            "ready_at": p.ready_at,
            "leaving_at": p.leaving_at,
            "gone_at": p.gone_at,
        }
        for p in fleet.pods
    ]
    requests = [
        {
            "began": o.began,
            "served": o.user.served,
            "ttft_s": o.user.ttft_s,
            "tpot_s": o.user.tpot_s,
            "tokens": o.user.tokens,
            "busy": o.user.busy,
            "attempts": o.user.attempts,
            "within": o.user.within_slo(),
        }
        for o in offered
    ]
    return {"ticks": [asdict(t) for t in ticks], "pods": pods, "requests": requests}


async def run_one(
    case: str, name: str, config: Config, repetition: int, tmp: Path
) -> dict[str, Any]:
    """One configuration on one case: a fresh fleet and balancer, the trace, the figures."""
    shape = loads.SHAPES[case.partition("-")[0]]
    seed = SEED + repetition
    load = loads.Load(
        shape=shape,
        open_loop=case.endswith("-open"),
        pod_users=POD_USERS,
        pod_rate=POD_RATE,
        seed=seed,
    )
    balancer = Balancer(tmp, servers.free_port(), BALANCE)
    clock = loads.Clock(SCALE)
    fleet = Fleet(
        flags=pod_flags(SHRINK, POD_SEQS),
        sidecar=config.sidecar,
        metrics_from=config.metrics_from,
        delays=delays(seed),
        balancer=balancer,
        logs=tmp,
        clock=clock,
        scale=SCALE,
        drain_s=DRAIN_S,
        sidecar_settings=signal_settings(SCALE),
    )
    edges = shape.bounds(SCALE)
    end = edges[-1]
    balancer.start([])
    try:
        await warm(fleet, config, shape, seed)
        offered, ticks = await asyncio.gather(
            loads.offer(balancer.url, load, clock, SCALE),
            scaler(config, fleet, lambda at: shape.share(at, SCALE), end),
        )
    finally:
        await fleet.close()
        balancer.stop()
    step = (edges[shape.step[0]], edges[shape.step[1]]) if shape.step else (0.0, end)
    run = {
        "case": case,
        "config": name,
        "label": config.label,
        "repetition": repetition,
        "scale": SCALE,
        "end": end,
        "step": step,
        **record(fleet, ticks, offered),
    }
    run["summary"] = report.summarise(run)
    run["max_replicas"] = read_keda().spec.max_replicas
    return run


def main() -> int:
    servers.pin_clients()
    OUT.mkdir(exist_ok=True)
    table = configs()
    shipped = read_keda()
    print(
        f"bench-fleet: time scale {SCALE:g}x (every interval / {SCALE:g}), pods "
        f"H100 Qwen2.5-14B, 1/{SHRINK:g} of its KV, {POD_SEQS} seqs; {POD_USERS} users or "
        f"{POD_RATE:g}/s a pod, "
        f"{BALANCE}, start {START_S[0]:g}-{START_S[-1]:g} s; shipped: {shipped.spec}, "
        f"pollingInterval {shipped.polling_s:g} s, {shipped.query} / {shipped.threshold:g}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    runs = []
    for repetition, case, name in itertools.product(range(REPETITIONS), CASES, CONFIGS):
        with tempfile.TemporaryDirectory(prefix="fleet-") as tmp:
            began = time.monotonic()
            run = asyncio.run(run_one(case, name, table[name], repetition, Path(tmp)))
        runs.append(run)
        s = run["summary"]
        print(
            f"{case:>13} {name:>6} rep {repetition}: attainment {s['attainment']:.1%} of "
            f"{s['offered']}, replica-s {s['replica_s']:,.0f}, max pods {s['max_replicas']}, "
            f"{time.monotonic() - began:.0f} s",
            flush=True,
        )
    lines = [
        f"time scale {SCALE:g}x; load average at the end {os.getloadavg()[0]:.2f}; "
        f"{platform.python_implementation()} {platform.python_version()}"
    ]
    for case in CASES:
        shape = loads.SHAPES[case.partition("-")[0]]
        rows = {
            n: report.medians([r for r in runs if (r["case"], r["config"]) == (case, n)])
            for n in CONFIGS
        }
        lines += report.table(case, rows, {n: table[n].label for n in CONFIGS})
        limit = oracle_limit(shape, sum(START_S) / len(START_S))
        lines.append(
            f"\noracle limit: a start delay of {sum(START_S) / len(START_S):.0f} s "
            f"allows at most {limit:.1%} attainment (TTFT objective {TTFT_S:g} s)"
        )
    text = "\n".join(lines)
    print(text)
    (OUT / "fleet.md").write_text(text + "\n")
    (OUT / "fleet.json").write_text(json.dumps(runs, indent=1))
    report.write_plot(runs, CASES, OUT / "fleet.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
