"""When will the next places free? A forecast from the requests that hold them now.

Little's law (the places over the mean time one is held) says how fast places free on average;
it cannot see when they free after a burst. A burst starts every stream at once, so none ends
before the shortest hold, whatever the mean, and the first to end are the short ones. Quoted at
Little's pace, the GPU-shaped burst's refused callers (31 streams of 13-50 s held, 65 refused)
came back from the first seconds on, while nothing could free, and 40-50 % of those returns
were refused again.

The forecast looks at each holder's age instead. Given how long the requests served lately held
their place (a sorted sample; the engine's own histogram stands in for a fresh pod's), a holder
of age ``a`` ends at the hold it draws among those longer than ``a``. Holders of the same age
draw spread quantiles of it (a low-discrepancy sequence, deterministic), so ``n`` holders that
started together free their places at the sample's ``1/n``, ``2/n``, ... quantiles: the n-th
place frees when the n-th of them is expected to end. A freed place is taken at once by whoever
is owed it (a waiter, a refused caller told to come back then) and held again for a fresh draw,
so the schedule runs on past the holders of now. Pure: ages and holds in, seconds out.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence

# The golden ratio's fraction: i x it mod 1 spreads any run of draws evenly over (0, 1).
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def draw(i: int) -> float:
    """The ``i``-th quantile drawn (0 <= draw < 1): evenly spread whatever run of ``i``."""
    return (i * _GOLDEN) % 1.0


def quantile(holds: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 <= q < 1) of the sorted, non-empty ``holds``."""
    return holds[min(len(holds) - 1, int(q * len(holds)))]


def remaining_s(age: float, q: float, holds: Sequence[float]) -> float:
    """How much longer a holder of ``age`` seconds holds, at the ``q`` quantile of the sorted
    ``holds`` longer than its age. One older than every hold seen ends within the median hold
    (at ``q`` of it): the sample says nothing of it, but it has already outlived them all."""
    first_longer = bisect.bisect_right(holds, age)
    longer = len(holds) - first_longer
    if longer == 0:
        return q * quantile(holds, 0.5)
    return holds[first_longer + min(longer - 1, int(q * longer))] - age


class FreesForecast:
    """The seconds from now until each of the next places frees, in order, extended as far as it
    is asked (:meth:`at`): the holders of now end at their draws, and each place freed is held
    again for a fresh one.

    ``ages``: how long each holder has held its place; ``holds``: the sorted sample of how long
    places are held, not empty."""

    def __init__(self, ages: Sequence[float], holds: Sequence[float], *, limit: int) -> None:
        if not holds:
            raise ValueError("the forecast needs at least one hold")
        self._holds = holds
        self._limit = limit
        self._drawn = 0
        self._ends: list[float] = []
        for age in sorted(ages):
            self._drawn += 1
            self._ends.append(remaining_s(max(age, 0.0), draw(self._drawn), holds))
        heapq.heapify(self._ends)
        self._frees: list[float] = []

    def at(self, place: int) -> float | None:
        """Seconds until the ``place``-th place from now frees (0: the next one); None where
        nothing holds one, or past the forecast's ``limit`` of places."""
        frees, ends = self._frees, self._ends
        while len(frees) <= place and ends and len(frees) < self._limit:
            end = heapq.heappop(ends)
            frees.append(end)
            self._drawn += 1
            heapq.heappush(ends, end + quantile(self._holds, draw(self._drawn)))
        return frees[place] if place < len(frees) else None

    def within(self, seconds: float) -> int:
        """How many places free within ``seconds`` from now (at most the ``limit``)."""
        place = 0
        while (free := self.at(place)) is not None and free <= seconds:
            place += 1
        return place
