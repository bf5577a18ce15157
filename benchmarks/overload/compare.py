"""How the sidecar is compared: its figure over another's, repetition by repetition (paired:
they ran minutes apart, through the same drift), and the engine's best operating point, the
most SLO goodput straight at the engine over a sweep of client counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from demo.slo import median, ratio


@dataclass(frozen=True, slots=True, kw_only=True)
class Paired:
    """Ours over theirs in each repetition: the median and the worst repetition."""

    median: float
    worst: float


def paired(ours: Sequence[float], theirs: Sequence[float]) -> Paired:
    """Ours / theirs per repetition, the first repetitions of the longer list paired with the
    other's. Anything over nothing is infinitely more; nothing over nothing is 0 (no win); NaN
    where no repetition pairs."""
    ratios = [ratio(mine, other) for mine, other in zip(ours, theirs, strict=False)]
    ratios = [0.0 if math.isnan(r) else r for r in ratios]
    return Paired(median=median(ratios), worst=min(ratios, default=math.nan))


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """An operating point straight at the engine: closed-loop clients and the SLO goodput."""

    clients: int
    slo_goodput: float


def best(points: Iterable[Point]) -> Point | None:
    """The point with the most SLO goodput; of equals, the one with fewer clients (it serves as
    much with less); None for no point."""
    return min(points, key=lambda p: (-p.slo_goodput, p.clients), default=None)
