"""Declared memory figures for the tests: nothing declared, or that with a few figures set."""

from __future__ import annotations

from dataclasses import replace

from sidecar.live.probes.static import Declared

NOTHING_DECLARED = Declared(
    vram_total_bytes=None,
    weights_bytes=None,
    weights_measured=False,
    overhead_bytes=0,
    kv_pool_bytes=None,
    observed_at=0.0,
)


def declared(**figures: object) -> Declared:
    """Nothing declared but ``figures`` (Declared's field names)."""
    return replace(NOTHING_DECLARED, **figures)  # type: ignore[arg-type]
