"""The Kubernetes HorizontalPodAutoscaler's algorithm, as a pure function of what it reads.

Source: https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/ ("Algorithm
details", "Configurable scaling behavior"), and where the page is silent the controller it
describes (kubernetes/pkg/controller/podautoscaler: horizontal.go, replica_calculator.go):

- ``desiredReplicas = ceil[currentReplicas * (currentMetricValue / desiredMetricValue)]``; no
  change while the ratio is within the tolerance of 1.0 (0.1 by default).
- Pods and AverageValue metrics (:func:`pods_proposal`): pods without a metric and pods not yet
  ready are set aside; on a scale-up they count as 0, a pod without a metric counts as the target
  on a scale-down; with them the ratio is computed again, and if it is then within the tolerance
  or points the other way, nothing changes.
- External metrics with an AverageValue target (KEDA's triggers, :func:`external_proposal`): the
  value is divided by the target, ``ceil(value / target)``, the tolerance applied to
  ``value / (target * currentReplicas)``.
- ``behavior`` (:func:`decide`): each sync's proposal is remembered; within the scale-down
  stabilization window the highest one is used, within the scale-up window the lowest. Then the
  policies limit the change per ``periodSeconds`` (the replicas added or removed in the trailing
  period count against it), ``selectPolicy: Max`` (the default) taking the policy that allows
  the most change, ``Min`` the least, ``Disabled`` none. Last, minReplicas and maxReplicas.

Everything here is values in, values out: no clock, no I/O (``now`` is passed in, in seconds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance, the controller's default
SYNC_PERIOD_S = 15.0  # --horizontal-pod-autoscaler-sync-period, the controller's default


@dataclass(frozen=True, slots=True)
class Policy:
    """One ``behavior`` policy: ``Pods`` (a count) or ``Percent`` of the period's start."""

    kind: str
    value: int
    period_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Rules:
    """One direction's ``behavior``: its stabilization window, policies and selectPolicy."""

    window_s: float
    policies: tuple[Policy, ...]
    select: str = "Max"


# The page's defaults ("Default Behavior").
DEFAULT_SCALE_UP = Rules(
    window_s=0, policies=(Policy("Percent", 100, 15), Policy("Pods", 4, 15)), select="Max"
)
DEFAULT_SCALE_DOWN = Rules(window_s=300, policies=(Policy("Percent", 100, 15),))


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    """What an HPA object fixes: the bounds, the behavior and the tolerance."""

    min_replicas: int
    max_replicas: int
    scale_up: Rules = DEFAULT_SCALE_UP
    scale_down: Rules = DEFAULT_SCALE_DOWN
    tolerance: float = TOLERANCE


@dataclass(frozen=True, slots=True)
class PodSample:
    """One pod as the HPA sees it: ready or not, and its metric (None: missing)."""

    ready: bool
    value: float | None


@dataclass(frozen=True, slots=True)
class Event:
    """A rescale: when, and by how many replicas (always positive)."""

    at: float
    replicas: int


@dataclass(frozen=True, slots=True)
class History:
    """What the controller remembers between syncs: proposals and rescales."""

    proposals: tuple[tuple[float, int], ...] = ()
    ups: tuple[Event, ...] = ()
    downs: tuple[Event, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One sync's outcome: the metric's proposal, after the windows, after the policies and
    bounds (``desired``), the reason that limited it, and the history to carry forward."""

    proposal: int
    stabilized: int
    desired: int
    limited_by: str
    history: History


def _within(ratio: float, tolerance: float) -> bool:
    return abs(ratio - 1.0) <= tolerance


def external_proposal(
    value: float, target: float, current: int, tolerance: float = TOLERANCE
) -> int:
    """The replicas an External metric with an AverageValue target asks for (KEDA's triggers:
    ``value`` is the query's result, a sum over the pods)."""
    if current > 0 and _within(value / (target * current), tolerance):
        return current
    return math.ceil(value / target)


def pods_proposal(
    samples: Sequence[PodSample], target: float, current: int, tolerance: float = TOLERANCE
) -> int | None:
    """The replicas a Pods metric with an AverageValue target asks for, with the page's rules
    for pods not yet ready and pods without a metric; None when no ready pod has a metric (the
    controller then does not scale)."""
    measured = [s.value for s in samples if s.ready and s.value is not None]
    if not measured:
        return None
    ratio = sum(measured) / len(measured) / target
    missing = sum(1 for s in samples if s.ready and s.value is None)
    unready = sum(1 for s in samples if not s.ready) if ratio > 1.0 else 0
    if unready == 0 and missing == 0:
        return current if _within(ratio, tolerance) else math.ceil(ratio * len(measured))
    filled = [*measured, *([target if ratio < 1.0 else 0.0] * missing), *([0.0] * unready)]
    again = sum(filled) / len(filled) / target
    if _within(again, tolerance) or (ratio < 1.0 < again) or (again < 1.0 < ratio):
        return current
    proposal = math.ceil(again * len(filled))
    flipped = (again < 1.0 and proposal > current) or (again > 1.0 and proposal < current)
    return current if flipped else proposal


def _stabilize(spec: Spec, history: History, now: float, current: int, proposal: int) -> int:
    up = down = proposal
    for at, recommended in history.proposals:
        if at > now - spec.scale_up.window_s:
            up = min(up, recommended)
        if at > now - spec.scale_down.window_s:
            down = max(down, recommended)
    return min(max(current, up), down)


def _changed(events: Sequence[Event], now: float, period_s: float) -> int:
    return sum(e.replicas for e in events if e.at > now - period_s)


def _up_limit(rules: Rules, history: History, now: float, current: int) -> int:
    if rules.select == "Disabled":
        return current
    limits = []
    for p in rules.policies:
        start = current - _changed(history.ups, now, p.period_s)
        start += _changed(history.downs, now, p.period_s)
        pods = start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100))
        limits.append(pods)
    return max(current, min(limits) if rules.select == "Min" else max(limits))


def _down_limit(rules: Rules, history: History, now: float, current: int) -> int:
    if rules.select == "Disabled":
        return current
    limits = []
    for p in rules.policies:
        start = current + _changed(history.downs, now, p.period_s)
        start -= _changed(history.ups, now, p.period_s)
        pods = start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100))
        limits.append(pods)
    return min(current, max(limits) if rules.select == "Min" else min(limits))


def _bounded(
    spec: Spec, history: History, now: float, current: int, wanted: int
) -> tuple[int, str]:
    if wanted > current:
        ceiling = min(spec.max_replicas, _up_limit(spec.scale_up, history, now, current))
        reason = "ScaleUpLimit" if ceiling < spec.max_replicas else "TooManyReplicas"
        return (ceiling, reason) if wanted > ceiling else (wanted, "DesiredWithinRange")
    if wanted < current:
        floor = max(spec.min_replicas, _down_limit(spec.scale_down, history, now, current))
        reason = "ScaleDownLimit" if floor > spec.min_replicas else "TooFewReplicas"
        return (floor, reason) if wanted < floor else (wanted, "DesiredWithinRange")
    return wanted, "DesiredWithinRange"


def _remember(spec: Spec, history: History, now: float, change: int, proposal: int) -> History:
    """``history`` with this sync's proposal and rescale (``change``: desired - current), less
    what no window or period reaches any more."""
    keep_s = max(spec.scale_up.window_s, spec.scale_down.window_s)
    periods = [p.period_s for p in (*spec.scale_up.policies, *spec.scale_down.policies)]
    events_s = max(periods, default=0.0)
    proposals = (*((at, r) for at, r in history.proposals if at > now - keep_s), (now, proposal))
    ups = tuple(e for e in history.ups if e.at > now - events_s)
    downs = tuple(e for e in history.downs if e.at > now - events_s)
    if change > 0:
        ups += (Event(now, change),)
    elif change < 0:
        downs += (Event(now, -change),)
    return replace(history, proposals=proposals, ups=ups, downs=downs)


def decide(spec: Spec, history: History, *, now: float, current: int, proposal: int) -> Decision:
    """One sync: the metric's ``proposal`` through the stabilization windows, the policies and
    the bounds, with ``current`` replicas (the scale's spec.replicas) at ``now``."""
    if current > spec.max_replicas or current < spec.min_replicas:
        stabilized = min(max(current, spec.min_replicas), spec.max_replicas)
        desired, reason = stabilized, "OutOfRange"
    else:
        stabilized = _stabilize(spec, history, now, current, proposal)
        desired, reason = _bounded(spec, history, now, current, stabilized)
    return Decision(
        proposal=proposal,
        stabilized=stabilized,
        desired=desired,
        limited_by=reason,
        history=_remember(spec, history, now, desired - current, proposal),
    )
