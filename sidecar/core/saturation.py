"""The scale-out signal: demand over capacity, from the engine's evidence and the sidecar's queue
and refusals, whatever unit the admission limit is counted in.

Near 0 on an idle or cold pod; at or above 1 once requests wait (at the sidecar or at the
engine) or are refused. It is the largest of four ratios, each demand over a capacity:

- ``kv``: KV tokens in use over ``kv_threshold`` x the engine's pool (the engine's usage share
  over the threshold). llm-d's workload-variant autoscaler sizes a replica the same way: its
  memory-bound capacity is the KV tokens x a threshold, its demand the tokens in use plus the
  queue x the mean prompt (llm-d/llm-d-workload-variant-autoscaler,
  internal/engines/analyzers/saturation_v2/analyzer.go, commit b28a4f6). Here the requests that
  wait are the queue ratios' evidence instead, counted as requests, not priced in tokens.
- ``engine_queue``: once ``queue_threshold`` or more requests wait at the engine, the engine runs
  all it can (its sequence cap, or its pool): (running + waiting) / running. That autoscaler
  takes what is in use while its queue stands at its threshold (5) as the compute-bound capacity
  the same way; a request or two waiting for the next step is not saturation.
- ``sidecar_queue``: requests waiting for admission: (in flight + queued) / in flight.
- ``refusals``: 1 + the share of the requests that ended in the last ``refusal_window_s``
  (``OutcomeWindow``) that were refused for want of capacity, at any cap
  (``CAPACITY_REFUSALS``): 1 to 2.

The refusal window is what a scrape needs, no more. The gauge is read when scraped: a refusal
shows in it for the window, so a scrape interval up to the window is sure to see it once, and
an autoscaler that polls Prometheus as often as it scrapes reads that sample (deploy/: every 15 s;
30 s is Prometheus's and KEDA's usual interval). Longer only keeps a pod reading as refusing
after it stopped: the EPP steers around it meanwhile, and at a minute the shipped HPA's next
scale-up step (its policy period is 60 s) could still count a burst that ended a minute before.

The engine's two ratios are the largest of its readings over the last ``hold_s``
(``EnginePeaks``), each reading's queue against the most requests the engine ran in that time:
its queue comes and goes with each wave of completions, and the autoscaler above reads vLLM's
gauges as their peak over a minute for the same reason. The peaks are held only while requests
run through the sidecar or wait in it: once none do, the load has ended, and the engine's latest
reading alone counts, so an idle pod reads 0 at the first tick after its last request instead of
its last KV share for ``hold_s``.

Like the flow-control pool saturation of llm-d's router (``flow_control_pool_saturation``,
llm-d/llm-d-router pkg/epp/metrics/llm_d_router_metrics.go, commit b64f44e: 0 empty, 1 fully
saturated; later versions: above 1 the magnitude of oversubscription), 1 is the set point and
above it the pod is oversubscribed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.core.outcomes import EDGE_FAULTS, REJECTIONS

# The outcomes that refuse a request for want of capacity, at every cap the sidecar has: each
# busy answer of admission but too_large (a client error) and draining (a shutdown), and each 503
# of the edge (its connection, partial-head, pre-admission and body-buffer caps).
CAPACITY_REFUSALS: frozenset[str] = frozenset(
    {code for code in REJECTIONS if code not in ("too_large", "draining")}
    | {code for code, refusal in EDGE_FAULTS.items() if refusal.status == 503}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SaturationConfig:
    """The thresholds: KV share counted as full; engine queue length that shows it at its cap;
    how long an engine reading's ratios are held; how long a refusal is counted."""

    kv_threshold: float = 0.8
    queue_threshold: int = 5
    hold_s: float = 30.0
    refusal_window_s: float = 30.0


@dataclass(frozen=True, slots=True)
class EngineEvidence:
    """One reading of the engine; None where the engine does not say it."""

    kv_usage_ratio: float | None = None  # 0..1 of its pool
    running: float | None = None
    waiting: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SaturationEvidence:
    """What is known now: the engine's ratios (held, ``EnginePeaks``) and the sidecar's state."""

    engine_kv: float = 0.0
    engine_queue: float = 0.0
    sidecar_in_flight: int = 0  # requests the sidecar let through, running now
    sidecar_queued: int = 0
    recent_offered: float = 0.0  # requests that ended lately, refusals included
    recent_refused: float = 0.0  # of them, refused for want of capacity


@dataclass(frozen=True, slots=True, kw_only=True)
class Saturation:
    """The signal and the four ratios it is the largest of."""

    utilisation: float
    kv: float
    engine_queue: float
    sidecar_queue: float
    refusals: float

    def to_dict(self) -> dict[str, float]:
        return {
            "utilisation": round(self.utilisation, 4),
            "kv": round(self.kv, 4),
            "engine_queue": round(self.engine_queue, 4),
            "sidecar_queue": round(self.sidecar_queue, 4),
            "refusals": round(self.refusals, 4),
        }


def saturation(evidence: SaturationEvidence) -> Saturation:
    """Demand over capacity: the largest of the KV, engine-queue, sidecar-queue and refusal
    ratios (module docstring)."""
    kv, engine_queue = evidence.engine_kv, evidence.engine_queue
    sidecar_queue, refusals = _sidecar_queue(evidence), _refusals(evidence)
    return Saturation(
        utilisation=max(kv, engine_queue, sidecar_queue, refusals),
        kv=kv,
        engine_queue=engine_queue,
        sidecar_queue=sidecar_queue,
        refusals=refusals,
    )


def engine_ratios(
    e: EngineEvidence, config: SaturationConfig, capacity: float | None = None
) -> tuple[float, float]:
    """(kv, engine_queue) of one engine reading; ``capacity``: the most requests the engine
    was seen running lately (its reading's own running count where not given)."""
    return _kv(e, config), _engine_queue(e, config, capacity)


def _kv(e: EngineEvidence, config: SaturationConfig) -> float:
    if e.kv_usage_ratio is None:
        return 0.0
    return e.kv_usage_ratio / config.kv_threshold


def _engine_queue(e: EngineEvidence, config: SaturationConfig, capacity: float | None) -> float:
    waiting, running = e.waiting or 0.0, e.running or 0.0
    if waiting < config.queue_threshold:
        return 0.0
    return (running + waiting) / max(capacity or 0.0, running, 1.0)


class EnginePeaks:
    """The engine's readings of the last ``hold_s``: the largest of their ratios, each reading's
    queue priced against the most requests any of them ran (between two waves of completions a
    reading shows few running and many waiting: its own count would overstate the demand)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._seen: deque[tuple[float, EngineEvidence]] = deque()

    def add(self, now: float, reading: EngineEvidence) -> None:
        self._seen.append((now, reading))

    def ratios(
        self, now: float, config: SaturationConfig, *, hold: bool = True
    ) -> tuple[float, float]:
        """(kv, engine_queue): the largest over the readings still held at ``now``; with
        ``hold`` false (no load through the sidecar), the latest reading's alone."""
        seen = self._seen
        while seen and now - seen[0][0] > self.hold_s:
            seen.popleft()
        if not hold:
            return engine_ratios(seen[-1][1], config) if seen else (0.0, 0.0)
        capacity = max((r.running or 0.0 for _, r in seen), default=0.0)
        pairs = [engine_ratios(r, config, capacity) for _, r in seen]
        return max((k for k, _ in pairs), default=0.0), max((q for _, q in pairs), default=0.0)


def _sidecar_queue(e: SaturationEvidence) -> float:
    if e.sidecar_queued <= 0:
        return 0.0
    return (e.sidecar_in_flight + e.sidecar_queued) / max(e.sidecar_in_flight, 1)


def _refusals(e: SaturationEvidence) -> float:
    if e.recent_refused <= 0 or e.recent_offered <= 0:
        return 0.0
    return 1.0 + min(1.0, e.recent_refused / e.recent_offered)


class OutcomeWindow:
    """Cumulative outcome counts sampled over time; says how many requests ended, and how many
    were refused for want of capacity, within the last ``window_s``. Times are given, not read."""

    def __init__(self, window_s: float = 30.0, min_spacing_s: float = 1.0) -> None:
        self.window_s, self._spacing = window_s, min_spacing_s
        self._samples: deque[tuple[float, float, float]] = deque()

    def recent(self, now: float, counts: Mapping[str, float]) -> tuple[float, float]:
        """(ended, refused) since the oldest sample inside the window, after recording
        ``counts`` (cumulative, by outcome) as seen at ``now``."""
        total = sum(counts.values())
        refused = sum(v for k, v in counts.items() if k in CAPACITY_REFUSALS)
        samples = self._samples
        if not samples or now - samples[-1][0] >= self._spacing:
            samples.append((now, total, refused))
        while len(samples) > 1 and now - samples[1][0] >= self.window_s:
            samples.popleft()
        _, total0, refused0 = samples[0]
        return max(0.0, total - total0), max(0.0, refused - refused0)
