"""How long completions really are, learned online, and how much more a running one will grow.

Kept per compartment and per max_tokens band (powers of two), in a fixed-size window of the most
recent lengths, so memory is bounded and the estimate follows drift. A stream that has produced
``g`` tokens is expected to grow by the mean of ``L - g`` over the recent lengths ``L`` longer than
``g``: with the heavy tails of real completion lengths, a stream that has already run long will
most likely run longer still, and one just started will most likely end soon. Pure: no clock.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import accumulate

Key = tuple[str, int]  # (compartment, band)


def band_of(max_tokens: int) -> int:
    """The max_tokens band: the smallest power of two >= max_tokens (at least 1)."""
    return 1 << max(0, math.ceil(math.log2(max(1, max_tokens))))


@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """The last ``window`` lengths per band; below ``min_samples`` the worst case is used."""

    min_samples: int = 20
    window: int = 256

    def __post_init__(self) -> None:
        if self.min_samples < 1 or self.window < self.min_samples:
            raise ValueError("need 1 <= min_samples <= window")


class _Window:
    """Recent lengths; sorted with suffix sums on demand (once per change, not per question)."""

    __slots__ = ("_lengths", "_sorted", "_suffix")

    def __init__(self, size: int) -> None:
        self._lengths: deque[int] = deque(maxlen=size)
        self._sorted: list[int] = []
        self._suffix: list[int] = []  # _suffix[i] = sum(_sorted[i:])

    def add(self, length: int) -> None:
        self._lengths.append(length)
        self._sorted = []

    def __len__(self) -> int:
        return len(self._lengths)

    def _prepare(self) -> None:
        if not self._sorted:
            self._sorted = sorted(self._lengths)
            self._suffix = [*reversed([*accumulate(reversed(self._sorted))]), 0]

    def mean(self) -> int:
        self._prepare()
        return math.ceil(self._suffix[0] / len(self._sorted))

    def growth_after(self, produced: int) -> int | None:
        """Mean of ``L - produced`` over the lengths beyond ``produced``; None if none is."""
        self._prepare()
        first = bisect_right(self._sorted, produced)
        longer = len(self._sorted) - first
        if longer == 0:
            return None
        return math.ceil(self._suffix[first] / longer) - produced


class CompletionEstimator:
    """Completion lengths of finished requests, and the growth they predict for running ones."""

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self.config = config or EstimatorConfig()
        self._windows: dict[Key, _Window] = {}

    def observe(self, compartment: str, max_tokens: int, completion_tokens: int) -> None:
        """A request of ``max_tokens`` finished after ``completion_tokens`` (clamped to 0..max)."""
        key = (compartment, band_of(max_tokens))
        window = self._windows.setdefault(key, _Window(self.config.window))
        window.add(min(max(0, completion_tokens), max_tokens))

    def _learned(self, compartment: str, max_tokens: int) -> _Window | None:
        window = self._windows.get((compartment, band_of(max_tokens)))
        return window if window is not None and len(window) >= self.config.min_samples else None

    def growth(self, compartment: str, max_tokens: int, produced: int) -> int:
        """Tokens a request that has produced ``produced`` of ``max_tokens`` is still expected
        to add; its worst case while its band is unlearned or it has outlived every sample."""
        worst = max(0, max_tokens - produced)
        window = self._learned(compartment, max_tokens)
        found = None if window is None else window.growth_after(produced)
        return worst if found is None else min(worst, found)

    def expected(self, compartment: str, max_tokens: int) -> int:
        """The mean learned length for this band, never above ``max_tokens``; worst case if
        unsure."""
        window = self._learned(compartment, max_tokens)
        return max_tokens if window is None else min(max_tokens, window.mean())

    def learned(self) -> bool:
        """Whether any band has enough lengths to price by."""
        return any(len(w) >= self.config.min_samples for w in self._windows.values())

    def samples(self, compartment: str, max_tokens: int) -> int:
        """Lengths held for this request's band."""
        window = self._windows.get((compartment, band_of(max_tokens)))
        return 0 if window is None else len(window)

    def estimates(self) -> dict[Key, tuple[int, int]]:
        """Every band learned so far: (compartment, band) -> (expected tokens, samples)."""
        return {
            key: (self.expected(key[0], key[1]), len(window))
            for key, window in sorted(self._windows.items())
        }
