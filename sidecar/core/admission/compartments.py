"""Compartments of the bulkhead: who is guaranteed which share of the limit, and how far beyond.

A spec reads ``name=share[:cap],...`` (e.g. ``gold=50%:80%,silver=0.3``): ``share`` is the
fraction of the limit a compartment is guaranteed, ``cap`` the most it may hold by borrowing what
others leave unused (default: the whole limit). Whatever share is left goes to ``default``, which
also takes every key the spec does not name, so an unknown tenant can never claim a reserve.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

from sidecar.core.errors import ConfigError
from sidecar.core.exact import exact

DEFAULT = "default"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class CompartmentSpec:
    """One compartment: its guaranteed fraction of the limit and the fraction it may reach."""

    name: str
    share: Fraction | float
    cap: Fraction | float = 1

    def __post_init__(self) -> None:
        # Exact fractions: 29% of 100 permits is 29, not floor(28.999999999999996).
        object.__setattr__(self, "share", exact(self.share))
        object.__setattr__(self, "cap", exact(self.cap))

    def guaranteed(self, limit: int) -> int:
        """Units of ``limit`` reserved for this compartment (rounded down, never over the limit)."""
        return math.floor(limit * self.share)

    def ceiling(self, limit: int) -> int:
        """Units of ``limit`` this compartment may hold at most, borrowing included."""
        return math.floor(limit * self.cap)


@dataclass(frozen=True, slots=True)
class Compartments:
    """The set of compartments; always holds ``default``, shares sum to at most 1."""

    specs: tuple[CompartmentSpec, ...] = (CompartmentSpec(DEFAULT, 1),)

    def __post_init__(self) -> None:
        names = [spec.name for spec in self.specs]
        if DEFAULT not in names:
            raise ConfigError(f"compartments must include {DEFAULT!r}")
        if len(set(names)) != len(names):
            raise ConfigError(f"compartment named twice in {names}")
        if sum(Fraction(spec.share) for spec in self.specs) > 1:
            raise ConfigError("compartment shares add up to more than 100%")

    @property
    def names(self) -> tuple[str, ...]:
        """Compartment names, in the order the spec gave them (``default`` last if implied)."""
        return tuple(spec.name for spec in self.specs)

    def resolve(self, key: str) -> str:
        """The compartment a tenant/priority key belongs to: its own if named, else ``default``."""
        return key if key in self.names else DEFAULT


def parse_compartments(text: str | None) -> Compartments:
    """Parse a ``SIDECAR_COMPARTMENTS`` value; None or blank means one compartment for everyone.

    Raises ConfigError naming the part that is wrong.
    """
    if text is None or not text.strip():
        return Compartments()
    specs = [_parse_entry(part.strip()) for part in text.split(",") if part.strip()]
    given = sum(Fraction(spec.share) for spec in specs)
    if given > 1:
        raise ConfigError(
            f"compartment shares add up to {float(given):.0%}, more than 100%: {text!r}"
        )
    if DEFAULT not in {spec.name for spec in specs}:
        specs.append(CompartmentSpec(DEFAULT, 1 - given))
    return Compartments(tuple(specs))


def _parse_entry(entry: str) -> CompartmentSpec:
    name, sep, value = entry.partition("=")
    name = name.strip()
    if not sep or not _NAME.match(name):
        raise ConfigError(f"compartment entry {entry!r}: expected name=share[:cap], e.g. gold=50%")
    share_text, _, cap_text = value.partition(":")
    share = _fraction(share_text, entry)
    cap = _fraction(cap_text, entry) if cap_text.strip() else Fraction(1)
    if cap < share:
        raise ConfigError(
            f"compartment entry {entry!r}: cap {float(cap):.0%} is below share {float(share):.0%}"
        )
    return CompartmentSpec(name, share, cap)


def _fraction(text: str, entry: str) -> Fraction:
    raw = text.strip()
    try:
        value = Fraction(raw[:-1].strip()) / 100 if raw.endswith("%") else Fraction(raw)
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"compartment entry {entry!r}: {raw!r} is not a fraction") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"compartment entry {entry!r}: {raw!r} is outside 0..1 (or 0%..100%)")
    return value
