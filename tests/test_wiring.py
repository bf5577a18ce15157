"""The composition root's wiring: SIDECAR_* settings become the lower layers' plain arguments."""

from __future__ import annotations

import pytest

from sidecar.core.admission.modes import TokenMode
from sidecar.core.errors import ConfigError
from sidecar.core.plan.capacity import engine_cost
from sidecar.entry.settings import load_settings
from sidecar.entry.wiring import build_bulkhead, build_mode, model_cost


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
    mode = build_mode(settings, None, str, lambda: engine_cost(1, None))
    assert isinstance(mode, TokenMode)
    snap = build_bulkhead(settings, mode, limit=1000).snapshot()
    assert (snap.mode, snap.shadow, snap.max_in_flight) == ("tokens", True, 7)
    assert [(c.name, c.guaranteed) for c in snap.compartments] == [("gold", 600), ("default", 400)]


@pytest.mark.parametrize(
    "source", [pytest.param("nvml", id="nvml"), pytest.param("static", id="static")]
)
def test_sources_without_the_engine_need_the_model(source: str) -> None:
    """Only the engine can price a token without SIDECAR_MODEL; nvml and static say so."""
    settings = load_settings({"SIDECAR_CAPACITY_SOURCE": source, "SIDECAR_KV_POOL": "1GiB"})
    with pytest.raises(ConfigError, match="SIDECAR_MODEL is required"):
        model_cost(settings)


def test_the_engine_sources_need_no_model() -> None:
    """auto and vllm start without SIDECAR_MODEL: the engine's numbers will price tokens."""
    assert model_cost(load_settings({"SIDECAR_CAPACITY_SOURCE": "vllm"})) is None
