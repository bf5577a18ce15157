"""Counters and histograms that only the event loop's thread touches: plain numbers, no locks.

prometheus_client's ``Counter`` and ``Histogram`` take a lock on every ``inc`` and ``observe``
(a histogram's observation is two), so that any thread may count. The request metrics are only
ever counted by the proxy on the event loop, and scraped there too (the admin port's
``/metrics`` is served by the same loop), so the locks guard nothing: per request they cost
~3.3 us, against ~0.7 us here (docs/performance.md). What a scrape reads is the same text the
library writes for its own: the same families, samples, ``le`` labels and ``_created`` series.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import cast

from prometheus_client import metrics as _library
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# How the library writes an ``le`` bound (1.0, +Inf, 1e+09); untyped there.
_le = cast("Callable[[float], str]", floatToGoString)


def _with_created() -> bool:
    """The library's own switch (PROMETHEUS_DISABLE_CREATED_SERIES, ``disable_created_metrics``),
    read at scrape time as the library reads it."""
    return bool(getattr(_library, "_use_created", True))


class LoopCounter:
    """A counter with one label; every value in ``seed`` is exported from the start, at 0."""

    __slots__ = ("_created", "_values", "documentation", "label", "name")

    def __init__(self, name: str, documentation: str, label: str, seed: Iterable[str] = ()) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self._values: dict[str, float] = {}
        self._created: dict[str, float] = {}
        for value in seed:
            self._series(value)

    def _series(self, value: str) -> None:
        self._values[value] = 0.0
        self._created[value] = time.time()

    def inc(self, value: str) -> None:
        if value not in self._values:
            self._series(value)
        self._values[value] += 1.0

    def get(self, value: str) -> float:
        return self._values.get(value, 0.0)

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        created = _with_created()
        for value, count in self._values.items():
            family.add_metric([value], count, created=self._created[value] if created else None)
        return family


class LoopHistogram:
    """A histogram without labels, over fixed upper bounds (+Inf added)."""

    __slots__ = ("_bounds", "_counts", "_created", "_sum", "documentation", "name")

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(buckets) or len(set(buckets)) != len(buckets):
            raise ValueError("histogram buckets must be distinct and in increasing order")
        self.name, self.documentation = name, documentation
        self._bounds = tuple(float(bound) for bound in buckets)
        # One count per bucket, not cumulative; the last is +Inf's own.
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        self._created = time.time()

    def observe(self, amount: float) -> None:
        # The first bound >= amount, as the library's ``amount <= bound`` scan finds it.
        self._counts[bisect.bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    @property
    def count(self) -> int:
        return sum(self._counts)

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[])
        running, buckets = 0, []
        for bound, count in zip((*self._bounds, float("inf")), self._counts, strict=True):
            running += count
            buckets.append((_le(bound), float(running)))
        family.add_metric([], buckets, self._sum)
        if _with_created():
            family.samples.append(Sample(f"{self.name}_created", {}, self._created))
        return family


class LoopCollector(Collector):
    """Exposes loop-local counters and histograms to a registry, read at scrape time."""

    def __init__(self, series: Iterable[LoopCounter | LoopHistogram]) -> None:
        self._series = tuple(series)

    def collect(self) -> Iterator[Metric]:
        for series in self._series:
            yield series.family()
