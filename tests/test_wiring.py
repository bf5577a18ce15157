"""The composition root's wiring: SIDECAR_* settings become the lower layers' plain arguments."""

from __future__ import annotations

from sidecar.entry.settings import load_settings
from sidecar.entry.wiring import build_bulkhead


def test_build_bulkhead_reads_the_admission_settings() -> None:
    """SIDECAR_* admission settings shape the bulkhead."""
    settings = load_settings(
        {
            "SIDECAR_ADMISSION": "tokens",
            "SIDECAR_SHADOW": "true",
            "SIDECAR_MAX_CONCURRENT_CALLS": "7",
            "SIDECAR_COMPARTMENTS": "gold=60%",
        }
    )
    snap = build_bulkhead(settings, limit=1000).snapshot()
    assert (snap.mode, snap.shadow, snap.max_in_flight) == ("tokens", True, 7)
    assert [(c.name, c.guaranteed) for c in snap.compartments] == [("gold", 600), ("default", 400)]
