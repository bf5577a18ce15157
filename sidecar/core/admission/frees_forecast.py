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

Where the engine's KV cache decides who runs (the SLO law's drain ceiling), a place that frees
lets a caller in only if the cache holds one more request of the present mix, and the mix grows
as the holders decode (:class:`CacheGrowth`). After a burst every stream grows together: on the
GPU-shaped burst the ceiling fell from 33 to 23 in its first 18 s, the first ten places freed
let nobody in, and the callers quoted those places came back to be refused again. The forecast
then counts a place where the cache takes one more, not where a holder ends.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheGrowth:
    """The engine's KV cache as the holders fill it: ``pool_tokens`` in all, ``used_tokens`` now,
    a new request's ``prompt_tokens`` when it starts, and the tokens each running request adds
    a second (``tokens_per_s``, its decode pace)."""

    pool_tokens: float
    used_tokens: float
    prompt_tokens: float
    tokens_per_s: float

    def takes_one_more(self, running: int, used: float) -> bool:
        """Whether the cache holds one more request like the ``running`` ones holding ``used``
        tokens (the drain ceiling: ``running`` over the share of the pool they use)."""
        return running == 0 or used * (running + 1) <= running * self.pool_tokens


class FreesForecast:
    """The seconds from now until each of the next places frees, in order, extended as far as it
    is asked (:meth:`at`): the holders of now end at their draws, and each place freed is held
    again for a fresh one.

    ``ages``: how long each holder has held its place; ``holds``: the sorted sample of how long
    places are held, not empty. With ``cache``, a place is counted where the cache takes one
    more request, up to ``places`` held at once (the holders of now where not given): a holder
    ending may let none in (the others grew), or several (it held many tokens), and places
    within ``places`` that the cache holds now are free at once."""

    def __init__(
        self,
        ages: Sequence[float],
        holds: Sequence[float],
        *,
        limit: int,
        cache: CacheGrowth | None = None,
        places: int | None = None,
    ) -> None:
        if not holds:
            raise ValueError("the forecast needs at least one hold")
        self._holds = holds
        self._limit = limit
        self._cache = cache
        self._places = len(ages) if places is None else max(places, 0)
        self._drawn = 0
        # (when it ends, its tokens at 0 s): a holder holds ``tokens + pace x t`` at t s from now.
        self._ends: list[tuple[float, float]] = []
        base = self._bases(ages)
        for age, tokens in sorted(zip(ages, base, strict=True)):
            self._drawn += 1
            self._ends.append((remaining_s(max(age, 0.0), draw(self._drawn), holds), tokens))
        heapq.heapify(self._ends)
        self._tokens = sum(base)  # the holders' tokens at 0 s
        self._frees: list[float] = []
        self._admit(0.0)

    def _bases(self, ages: Sequence[float]) -> list[float]:
        """Each holder's tokens now: the prompt and what it decoded in its ``age``, shifted
        evenly up to what the cache says it holds where it says more. Never down: the engine's
        reading is a tick old, and a burst admitted since holds its prompts already (read on an
        idle pod, it would say the burst holds nothing)."""
        cache = self._cache
        if cache is None or not ages:
            return [0.0] * len(ages)
        grown = [cache.prompt_tokens + cache.tokens_per_s * max(age, 0.0) for age in ages]
        shift = max(0.0, cache.used_tokens - sum(grown)) / len(ages)
        return [tokens + shift for tokens in grown]

    def _admit(self, at: float) -> None:
        """At ``at`` s, the places the cache takes one more request in (each a place freed), up
        to ``places`` held; without a cache model, none here (every end frees one: :meth:`at`)."""
        cache, frees, ends = self._cache, self._frees, self._ends
        if cache is None:
            return
        pace = cache.tokens_per_s
        while len(ends) < self._places and len(frees) < self._limit:
            used = self._tokens + pace * at * len(ends)
            if not cache.takes_one_more(len(ends), used):
                return
            frees.append(at)
            self._hold(at, cache.prompt_tokens - pace * at)

    def _hold(self, at: float, tokens: float) -> None:
        self._drawn += 1
        heapq.heappush(self._ends, (at + quantile(self._holds, draw(self._drawn)), tokens))
        self._tokens += tokens

    def at(self, place: int) -> float | None:
        """Seconds until the ``place``-th place from now frees (0: the next one); None where
        nothing holds one, or past the forecast's ``limit`` of places."""
        frees, ends = self._frees, self._ends
        while len(frees) <= place and ends and len(frees) < self._limit:
            end, tokens = heapq.heappop(ends)
            self._tokens -= tokens
            if self._cache is None:
                frees.append(end)
                self._hold(end, 0.0)
            else:
                self._admit(end)
        return frees[place] if place < len(frees) else None

    def within(self, seconds: float) -> int:
        """How many places free within ``seconds`` from now (at most the ``limit``)."""
        place = 0
        while (free := self.at(place)) is not None and free <= seconds:
            place += 1
        return place
