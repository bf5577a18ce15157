"""When should a refused caller come back? Estimated from how fast places free for it.

Fed by the bulkhead (its injected clock; no clock of its own) with each grant to a waiting
request, how long each served request held its place and the places freed while the pod was
full (below: the pace, which comes first where it is known). With R such grants per second
lately and Q requests ahead, the wait is about (Q + 1) / R, clamped to sane bounds. Where costs
are tokens (adaptive admission), grants carry their tokens and the hint is the tokens that must
drain (those queued ahead, plus the caller's own) over the tokens granted per second.

R is measured on a clock that runs only while a request waits (``busy`` / ``idle``). Time while
nobody waits is time nobody asked for more, whatever ran: counted, light use before a burst (three
streams, nobody waiting) made one start look like ten seconds, and the burst was refused as
hopeless. Time while a request waits and nobody gets in does count, so the rate still falls when
the engine stalls.

Refused callers are not in the queue, so the queue alone would quote every caller of a burst the
same wait, and they would all come back together and be refused again. Each refusal is quoted
after those refused before it that are still due back (:class:`Returns`), one release each, with
jitter of up to one release more: the n-th caller of a burst comes back when capacity for it
frees, and no two places of a lap overlap. Until a rate is measured, the places are priced at a
guess (what is held ends within ``unknown_s``), and a lap is ``horizon_s`` of it: the places past
it start again from the first, so a burst larger than a lap comes back spread over the horizon,
a lap's worth per release, rather than over the time the guess would take to serve it all. On a
fresh pod the limit is still growing, and a caller told to come back late leaves it unpressed
and the engine unfed; once callers wait, the measured rate takes over.

Where it is known how long a request holds its place (:meth:`ReleaseRate.held`, the requests
served lately, weighed against the engine's own mean, :meth:`ReleaseRate.expect_hold`), the
places are priced by Little's law instead: the slots the pod runs over the time one is held is
how fast places free, whoever waits. Grants measure it only while callers wait: where the law
lets nobody wait (its TTFT objective already spent at the engine) none is ever measured, and where
a burst's first grants are the limit growing (slow start) they promise what no release will keep.
On the GPU-shaped burst (31 streams of 13-50 s) the grants promised the next places in 3-4 s,
and 86 % of the callers who came back as told were refused again.

While every place is held and their number is not growing fast (``full``), a place frees only
when a holder ends, and Little's pace cannot say when that is after a burst: it started every
stream at once, and none ends before the shortest hold. There the quotes, and the wait that
judges a queued request hopeless, read the forecast (:mod:`sidecar.core.admission.frees_forecast`)
from the ages of those holding (``holding`` / ``ended``) and the spread of how long places are
held: the requests served lately, the engine's own quantiles (vLLM's
``request_inference_time_seconds`` buckets) standing in for those short of
:data:`HOLD_PRIOR_WEIGHT`. The n-th refused caller is told when the n-th place has freed nine
times in ten (:data:`RETURN_MARGIN_Z`), jittered by up to the gap to the next. Where the engine's
KV cache decides who runs (:meth:`ReleaseRate.expect_cache`), a place frees where the cache takes
one more request as the holders grow, not where one ends.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.core.admission.frees_forecast import CacheGrowth, FreesForecast, quantile

MIN_RETRY_S = 0.5
# The longest wait ever asked for. The openai SDK honours a server's delay only within
# 0 < delay <= its limit (_base_client.py: 60 s in openai 1.54.0, MAX_RETRY_AFTER_DELAY = 120 s in
# 3.60.0), beyond which it falls back to its own backoff (1.x) or gives up (3.x): 60 s fits both.
MAX_RETRY_S = 60.0
# The longest a burst's places are spread over while the release rate is only guessed, before
# they start again from the first. Spread over the whole time the guess would take to serve them,
# the demo's 145 callers refused at once on a fresh pod (7 running, no release seen yet) were told
# 2.3-22.7 s, most of them past a 10 s run, and the engine ran 56 where it holds 71: the limit
# grows only while callers press on it. A known pace spreads them as far as it says, up to
# MAX_RETRY_S: a 4 s horizon on it, on an engine slow to drain (the GPU-shaped burst), brought
# callers back early, to be refused until their retries ran out.
SPREAD_HORIZON_S = 4.0
# How many requests served lately outweigh the engine's own mean time a request holds its place:
# fewer, and the engine's mean is counted as if it were the rest. A fresh pod's first ends are
# the burst's shortest streams (13 s of 13-50 s on the GPU-shaped burst); alone they would
# promise places twice as fast as the streams free them.
HOLD_PRIOR_WEIGHT = 16
# Places freed while the pod was full, measured: the slower of it and Little's pace prices a
# place. Little's pace over the requests served so far is too fast while a burst's long streams
# have not ended (its first ends are its shortest); the frees it sees are what frees now. At
# least FREES_MIN frees before it counts; the last FREES_WINDOW of them.
FREES_MIN = 4
FREES_WINDOW = 32
# The forecast of frees (:class:`FreesForecast`) runs at most this many places ahead, and is
# made again at most every FORECAST_FRESH_S while places are taken and freed, else every
# FORECAST_STALE_S (or once its first free is due): between, quotes read the one made.
FORECAST_PLACES = 4096
# A refused caller is quoted the place this many standard deviations past its own in the
# forecast: the k-th place frees at the k-th of the holders' ends, a count whose spread is at
# most sqrt(k) (binomial, or a renewal's with holds no more spread than their mean). Quoted at
# the expected k-th free, about half of them came back before it and were refused again (42 % of
# the GPU-shaped burst's returns admitted); 1.28 is the 90th percentile's.
RETURN_MARGIN_Z = 1.28
# A place past the highest bound is told it, less up to this share of it (jitter): they come back
# together near the bound, each quoted again from what the forecast sees then.
BEYOND_SPREAD = 0.1
FORECAST_FRESH_S = 0.1
FORECAST_STALE_S = 1.0


def clamped_retry_s(retry_after_s: float) -> float:
    """The wait a client is told: ``retry_after_s``, never beyond :data:`MAX_RETRY_S`."""
    return min(retry_after_s, MAX_RETRY_S)


@dataclass(frozen=True, slots=True)
class HintBounds:
    """Clamp of every hint; ``unknown_s`` is answered while there are too few releases to tell;
    ``horizon_s`` is the longest a burst's places are spread over while the rate is guessed
    (:func:`spread_s`)."""

    low_s: float = MIN_RETRY_S
    high_s: float = MAX_RETRY_S
    unknown_s: float = 1.0
    horizon_s: float = SPREAD_HORIZON_S


def spread_s(
    first_s: float, place: int, per_s: float, draw: float, horizon_s: float = math.inf
) -> float:
    """The wait quoted to a refused caller: ``first_s`` (until capacity for the first refused
    caller frees), one release interval (1 / ``per_s``) for each of the ``place`` refused callers
    due back before it, and ``draw`` (0 <= draw < 1) of one more as jitter. Within a lap places
    never overlap: every quote of a later place is at least as long, whatever the draws.

    A lap is the places that ``horizon_s`` of releases take; a place past it starts the next
    lap, from ``first_s`` again, so no quote is more than ``horizon_s`` (or one release, where
    that is longer) after the first."""
    lap = max(1, math.floor(per_s * horizon_s)) if math.isfinite(horizon_s) else place + 1
    return first_s + (place % lap + draw) / per_s


class Returns:
    """The refused callers still due back: each is counted until the time it was told, then it
    came back (or gave up). Bounded in number (``max_size``) and in age (no quote is longer than
    the hint's highest bound)."""

    def __init__(self, *, max_size: int = 4096) -> None:
        self._due: list[float] = []  # a heap of the times they were told to come back
        self._max_size = max_size

    def ahead(self, now: float) -> int:
        """How many refused callers are due back after ``now``."""
        due = self._due
        while due and due[0] <= now:
            heapq.heappop(due)
        return len(due)

    def told(self, due_at: float) -> None:
        """One more refused caller, told to come back at ``due_at``; beyond ``max_size`` the
        place saturates (the quotes are at their cap by then)."""
        if len(self._due) < self._max_size:
            heapq.heappush(self._due, due_at)


class PartTimeEvents:
    """The last ``window`` times of an event, on a clock that runs only while something holds
    (``run`` / ``stop``): time while it is stopped is not counted, so a spell when the event
    could not come does not read as the event coming slowly."""

    def __init__(self, window: int, *, running: bool = True) -> None:
        self.times: deque[float] = deque(maxlen=window)  # on the part-time clock
        self._stopped_since: float | None = None if running else 0.0
        self._stopped_s = 0.0  # stopped time before that: the clock is the time less it

    @property
    def running(self) -> bool:
        return self._stopped_since is None

    def run(self, at: float) -> None:
        """The clock runs from ``at`` on."""
        if self._stopped_since is not None:
            self._stopped_s += max(0.0, at - self._stopped_since)
            self._stopped_since = None

    def stop(self, at: float) -> None:
        """The clock stops at ``at``, until ``run``."""
        if self._stopped_since is None:
            self._stopped_since = at

    def clock(self, at: float) -> float:
        """``at`` on the part-time clock: less the stopped time before it (frozen while
        stopped)."""
        stopped = self._stopped_s
        if self._stopped_since is not None:
            stopped += max(0.0, at - self._stopped_since)
        return at - stopped

    def add(self, at: float) -> None:
        """The event came at ``at``."""
        self.times.append(self.clock(at))

    def rate_per_s(self, now: float | None = None, *, least: int = 2) -> float | None:
        """Events a second over the window, up to ``now`` (so the rate falls when they stop
        coming, instead of freezing); None before ``least`` of them (at least 2)."""
        times = self.times
        if len(times) < max(2, least):
            return None
        latest = max(times)
        end = latest if now is None else max(latest, self.clock(now))
        span = end - times[0]
        return (len(times) - 1) / span if span > 0 else None


class ReleaseRate:
    """Recent release times (the last ``window`` of them) and the retry hint they imply.

    ``draw`` is the jitter's source (uniform in [0, 1)): injected, so a test is deterministic.
    """

    def __init__(
        self,
        *,
        window: int = 64,
        bounds: HintBounds | None = None,
        draw: Callable[[], float] | None = None,
        returns: Returns | None = None,
    ) -> None:
        if window < 2:
            raise ValueError("window must hold at least 2 releases")
        self._grants = PartTimeEvents(window)  # on the busy clock: while a request waits
        self._amounts: deque[int] = deque(maxlen=window)
        self._bounds = bounds or HintBounds()
        self._draw = draw or random.Random().random  # noqa: S311 - jitter, not a secret
        self._returns = returns or Returns()
        self._holds: deque[float] = deque(maxlen=window)  # how long served requests held
        self._engine_hold_s: float | None = None  # the engine's mean, where it says one
        self._frees = PartTimeEvents(FREES_WINDOW, running=False)  # while the pod is full
        self._engine_holds: tuple[float, ...] = ()  # the engine's quantiles of the time held
        self._holding: dict[int, float] = {}  # ticket -> when it took its place
        self._cache: CacheGrowth | None = None  # the engine's KV cache, where it decides
        self._forecast: FreesForecast | None = None
        self._forecast_at = -math.inf
        self._forecast_places: int | None = None  # the places the forecast was made for
        self._changed = True  # a place taken or freed, a hold served, since the forecast

    @property
    def bounds(self) -> HintBounds:
        return self._bounds

    def observe(self, at: float, amount: int = 1) -> None:
        """Record one grant to a waiting request of ``amount`` (tokens; 1 for a permit) at time
        ``at`` (seconds)."""
        # Once per grant: two appends; the latest time is found when a hint is asked for.
        self._grants.add(at)
        self._amounts.append(amount)

    def idle(self, at: float) -> None:
        """Nobody waits from ``at`` on: the time until ``busy`` is not counted."""
        self._grants.stop(at)

    def busy(self, at: float) -> None:
        """A request waits again from ``at`` on."""
        self._grants.run(at)

    def full(self, at: float, full: bool) -> None:
        """The pod runs every place it has (``full``) or not, from ``at`` on: the full clock
        runs only while it does."""
        (self._frees.run if full else self._frees.stop)(at)

    def freed(self, at: float) -> None:
        """A place freed at ``at`` while the pod was full."""
        if self._frees.running:
            self._frees.add(at)

    def frees_per_s(self, now: float) -> float | None:
        """Places freed a second while the pod was full, over the last :data:`FREES_WINDOW`
        and up to ``now`` (so the rate falls when frees stop); None before :data:`FREES_MIN`
        of them."""
        return self._frees.rate_per_s(now, least=FREES_MIN)

    def held(self, seconds: float) -> None:
        """A request that was served held its place for ``seconds`` (grant to release)."""
        if seconds >= 0:
            self._holds.append(seconds)
            self._changed = True

    def holding(self, ticket: int, at: float) -> None:
        """The request ``ticket`` holds a place from ``at`` on."""
        self._holding[ticket] = at
        self._changed = True

    def ended(self, ticket: int, at: float, *, served: bool) -> None:
        """The request ``ticket`` gave its place back at ``at``; ``served``: it ran to its end
        (its hold is one of how long places are held)."""
        began = self._holding.pop(ticket, None)
        self._changed = True
        if served and began is not None:
            self.held(at - began)

    def expect_hold(self, seconds: float | None, quantiles: tuple[float, ...] = ()) -> None:
        """The engine's own mean time a request runs (None: it does not say), and its quantiles,
        evenly spaced, where it says how that time is spread."""
        self._engine_hold_s = seconds if seconds is not None and seconds > 0 else None
        spread = tuple(sorted(q for q in quantiles if q > 0))
        if spread != self._engine_holds:
            self._engine_holds = spread
            self._changed = True

    def expect_cache(self, cache: CacheGrowth | None) -> None:
        """The engine's KV cache as it fills, where it decides who runs (None: places alone
        do): the forecast counts a place where the cache takes one more request."""
        if cache != self._cache:
            self._cache = cache
            self._changed = True

    @property
    def sees_cache(self) -> bool:
        """Whether the forecast counts places by the cache (:meth:`expect_cache`)."""
        return self._cache is not None

    def hold_sample(self) -> list[float] | None:
        """How long places are held, sorted: the requests served lately, the engine's quantiles
        standing in for those short of :data:`HOLD_PRIOR_WEIGHT`; None while fewer are served
        and the engine does not say how its times are spread."""
        served = list(self._holds)
        short = HOLD_PRIOR_WEIGHT - len(served)
        if short > 0:
            prior = self._engine_holds
            if not prior:
                return None
            served += (quantile(prior, (i + 0.5) / short) for i in range(short))
        return sorted(served)

    def forecast(self, now: float, places: int | None = None) -> FreesForecast | None:
        """When the next places free, from the ages of those held now (:class:`FreesForecast`,
        its seconds counted from when it was made, ``_forecast_at``), up to ``places`` held at
        once where the cache decides (:meth:`expect_cache`); None while nothing is held or the
        time held is not known."""
        made = self._forecast
        age = now - self._forecast_at
        if (
            made is not None
            and places == self._forecast_places
            and age < (FORECAST_FRESH_S if self._changed else FORECAST_STALE_S)
        ):
            first = made.at(0)
            if first is not None and self._forecast_at + first >= now:
                return made
        holds = self.hold_sample()
        if not holds or not self._holding:
            self._forecast = None
            return None
        ages = [now - began for began in self._holding.values()]
        self._forecast = FreesForecast(
            ages, holds, limit=FORECAST_PLACES, cache=self._cache, places=places
        )
        self._forecast_at, self._forecast_places, self._changed = now, places, False
        return self._forecast

    def forecast_wait_s(
        self, queue_ahead: int, now: float, places: int | None = None
    ) -> float | None:
        """Seconds until a place frees for a waiter with ``queue_ahead`` waiters before it, while
        only frees let callers in: the forecast's (up to ``places``, :meth:`forecast`); None
        where it cannot tell."""
        forecast = self.forecast(now, places)
        free = None if forecast is None else forecast.at(max(queue_ahead, 0))
        return None if free is None else max(0.0, self._forecast_at + free - now)

    def hold_s(self) -> float | None:
        """How long a request holds its place: the mean of those served lately, the engine's
        mean standing in for the ones short of :data:`HOLD_PRIOR_WEIGHT`; None while neither
        says."""
        holds, prior = self._holds, self._engine_hold_s
        weight = 0 if prior is None else max(0, HOLD_PRIOR_WEIGHT - len(holds))
        count = len(holds) + weight
        if count == 0:
            return None
        mean = (sum(holds) + (prior or 0.0) * weight) / count
        return mean if mean > 0 else None

    def pace_per_s(self, slots: int) -> float | None:
        """Little's law: how many places free a second while ``slots`` are held, each for
        :meth:`hold_s`; None while that is unknown or nothing is held."""
        hold = self.hold_s()
        if hold is None or slots <= 0:
            return None
        return slots / hold

    def rate_per_s(self, now: float | None = None) -> float | None:
        """Grants to waiters per second over the window, up to ``now``, busy time only; None
        before two."""
        return self._grants.rate_per_s(now)

    def drain_per_s(self, now: float | None = None) -> float | None:
        """Tokens (amounts) released per second over the window; None before two releases."""
        rate = self.rate_per_s(now)
        count = len(self._grants.times)
        if rate is None or count < 2:
            return None
        # The first release only opens the span; the amounts after it are what drained in it.
        drained = sum(self._amounts) - self._amounts[0]
        return rate * drained / (count - 1)

    def wait_s(
        self, queue_ahead: int, now: float | None = None, *, tokens: int | None = None
    ) -> float | None:
        """Seconds until ``queue_ahead`` waiters and then this caller could be served, unclamped;
        None while there are too few releases to tell.

        With ``tokens`` (what must drain first, the caller's own included) the token drain rate
        decides instead of the release count.
        """
        if tokens is None:
            rate = self.rate_per_s(now)
            need = max(queue_ahead, 0) + 1
        else:
            rate = self.drain_per_s(now)
            need = max(tokens, 0)
        return need / rate if rate else None

    def place_wait_s(self, queue_ahead: int, now: float, *, slots: int) -> float | None:
        """Seconds until ``queue_ahead`` waiters and then this caller get in, once grants to
        waiters were measured: at the faster of them and the pace over ``slots``
        (:meth:`pace_per_s`); None before. Before any wait was measured nobody is judged
        hopeless: a fresh burst queues while slow start grows the limit, which no pace at the
        present cap foresees (counted, it refused 41 of a burst of 96 that vLLM alone served
        within the objectives, and 56 were within them instead of 96)."""
        rate = self.rate_per_s(now)
        if not rate:
            return None
        return (max(queue_ahead, 0) + 1) / max(rate, self.pace_per_s(slots) or 0.0)

    def retry_after_s(
        self, queue_ahead: int, now: float | None = None, *, tokens: int | None = None
    ) -> float:
        """``wait_s`` clamped to the bounds (``unknown_s`` while it cannot tell)."""
        bounds = self._bounds
        estimate = self.wait_s(queue_ahead, now, tokens=tokens)
        if estimate is None:
            estimate = bounds.unknown_s
        return min(max(estimate, bounds.low_s), bounds.high_s)

    def quote(
        self,
        queue_ahead: int,
        now: float,
        *,
        tokens: int | None = None,
        running: int = 1,
        slots: int | None = None,
        full: bool = False,
        places: int | None = None,
    ) -> float:
        """The wait told to one refused caller at ``now``, noted so that the next is told to
        come back after it: the time until capacity for it frees (``queue_ahead`` waiters, or
        ``tokens`` to drain, then the refused callers still due back before it, a release each),
        jittered by up to one release, within the bounds.

        Places free at Little's pace (:meth:`pace_per_s`) over the ``slots`` the pod runs when
        full (``running`` where more run or none is given), where the time a request holds is
        known, or at the places measured freeing while the pod was full (:meth:`frees_per_s`),
        whichever is slower where both are; else at the measured rate of grants. Either way a
        quote past the highest bound starts the next lap from the first place, rather than every
        later caller being told the bound together. While none is known, the ``running``
        requests and the ``queue_ahead`` are taken to end within ``unknown_s``: the first refused
        caller waits that, and that guess spreads the places over ``horizon_s`` at most.

        ``full``: only frees let anyone in now (every place held, and their number not growing
        fast): the quote is the forecast's (:meth:`_forecast_quote`, up to ``places``), where it
        can tell.
        """
        bounds = self._bounds
        if full and tokens is None:
            forecast = self.forecast(now, places)
            if forecast is not None:
                return self._forecast_quote(forecast, max(queue_ahead, 0), now)
        pace = None if tokens is not None else self.pace_per_s(max(running, slots or 0))
        frees = None if tokens is not None else self.frees_per_s(now)
        if frees is not None:
            pace = frees if pace is None else min(pace, frees)
        if pace is not None:
            per_s: float | None = pace
            first: float | None = (max(queue_ahead, 0) + 1) / pace
        else:
            per_s = self.rate_per_s(now)
            first = self.wait_s(queue_ahead, now, tokens=tokens)
        horizon_s = bounds.high_s
        if first is None or not per_s:
            per_s = max(running + max(queue_ahead, 0), 1) / bounds.unknown_s
            first = bounds.unknown_s
            horizon_s = bounds.horizon_s
        # The floor holds the first place only: the later ones spread out above it (floored
        # whole, a fast engine's first places would all be told the floor, together).
        first = max(first, bounds.low_s)
        place = self._returns.ahead(now)
        wait = min(spread_s(first, place, per_s, self._draw(), horizon_s), bounds.high_s)
        self._returns.told(now + wait)
        return wait

    def _forecast_quote(self, forecast: FreesForecast, queue_ahead: int, now: float) -> float:
        """The quote while every place is held: when the place owed to this caller (after the
        ``queue_ahead`` waiters' and the refused callers' due back before it) has freed nine
        times in ten (:data:`RETURN_MARGIN_Z`), jittered by up to the gap to the next. A place
        the forecast does not see free within the highest bound is told that bound, less up to
        :data:`BEYOND_SPREAD` of it: started again from the first place (a lap), those callers
        came back while every place was owed to others, and were refused again."""
        bounds = self._bounds
        owed = queue_ahead + self._returns.ahead(now)
        place = owed + round(RETURN_MARGIN_Z * math.sqrt(owed + 1))
        free = forecast.at(place)
        if free is None or self._forecast_at + free - now > bounds.high_s:
            wait = bounds.high_s * (1.0 - BEYOND_SPREAD * self._draw())
        else:
            after = forecast.at(place + 1)
            gap = 0.0 if after is None else after - free
            wait = self._forecast_at + free + self._draw() * gap - now
        wait = min(max(wait, bounds.low_s), bounds.high_s)
        self._returns.told(now + wait)
        return wait
