"""Exact fractions of the decimals a user types, so 29% of 100 permits is 29, never 28."""

from __future__ import annotations

from fractions import Fraction


def exact(value: Fraction | float) -> Fraction:
    """``value`` as the exact fraction of its shortest round-tripping decimal: 0.8 -> 4/5."""
    # repr() of a float is the shortest decimal that reads back as the same float: what was typed.
    return Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
