"""A request's latency objectives: its TTFT and per-output-token targets, where its claims state
them (``sidecar.core.request.claims``: llm-d's SLO headers, from trusted peers), else the defaults
the operator set."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.request.claims import Claims


@dataclass(frozen=True, slots=True)
class Objectives:
    """Seconds to the first token, and mean seconds per output token after it."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0:
            raise ValueError("objectives must be > 0")


def objectives_of(claims: Claims, defaults: Objectives) -> Objectives:
    """The request's own objectives where it claims them (> 0 ms), else ``defaults``."""
    ttft, tpot = claims.ttft_slo_ms, claims.tpot_slo_ms
    if not ttft and not tpot:
        return defaults
    return Objectives(
        ttft / 1000 if ttft else defaults.ttft_s, tpot / 1000 if tpot else defaults.tpot_s
    )
