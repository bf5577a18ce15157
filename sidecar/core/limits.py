"""What the bulkhead enforces: the limits a mode's law decides, pushed in one call."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What the bulkhead enforces, pushed to it in one call (``Bulkhead.resize``): ``limit`` in
    the mode's unit (permits, KV bytes, tokens; under slo, streams starting), ``in_flight`` a cap
    on requests in flight beside it (None: none but the setting's)."""

    limit: int
    in_flight: int | None = None
