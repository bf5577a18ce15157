"""How long completions really are: a quantile of recent completion lengths, learned online.

Kept per compartment and per max_tokens band (powers of two), in a fixed-size window of the most
recent lengths, so memory is bounded and the estimate follows drift. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

Key = tuple[str, int]  # (compartment, band)


def band_of(max_tokens: int) -> int:
    """The max_tokens band: the smallest power of two >= max_tokens (at least 1)."""
    return 1 << max(0, math.ceil(math.log2(max(1, max_tokens))))


@dataclass(frozen=True, slots=True)
class EstimatorConfig:
    """``quantile`` of the last ``window`` lengths; below ``min_samples`` the worst case is used."""

    quantile: float = 0.9
    min_samples: int = 20
    window: int = 256

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {self.quantile}")
        if self.min_samples < 1 or self.window < self.min_samples:
            raise ValueError("need 1 <= min_samples <= window")


class _Window:
    __slots__ = ("_cached", "_lengths")

    def __init__(self, size: int) -> None:
        self._lengths: deque[int] = deque(maxlen=size)
        self._cached: dict[float, int] = {}

    def add(self, length: int) -> None:
        self._lengths.append(length)
        self._cached.clear()

    def __len__(self) -> int:
        return len(self._lengths)

    def quantile(self, q: float) -> int:
        """The nearest-rank quantile: the smallest length with at least q of the window <= it."""
        if q not in self._cached:
            ordered = sorted(self._lengths)
            self._cached[q] = ordered[max(0, math.ceil(q * len(ordered)) - 1)]
        return self._cached[q]


class CompletionEstimator:
    """Expected completion tokens of a request, from what finished requests really produced."""

    def __init__(self, config: EstimatorConfig | None = None) -> None:
        self.config = config or EstimatorConfig()
        self._windows: dict[Key, _Window] = {}

    def observe(self, compartment: str, max_tokens: int, completion_tokens: int) -> None:
        """A request of ``max_tokens`` finished after ``completion_tokens`` (clamped to 0..max)."""
        key = (compartment, band_of(max_tokens))
        window = self._windows.setdefault(key, _Window(self.config.window))
        window.add(min(max(0, completion_tokens), max_tokens))

    def expected(self, compartment: str, max_tokens: int) -> int:
        """The learned quantile for this band, never above ``max_tokens``; worst case if unsure."""
        window = self._windows.get((compartment, band_of(max_tokens)))
        if window is None or len(window) < self.config.min_samples:
            return max_tokens
        return min(max_tokens, window.quantile(self.config.quantile))

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
