"""Declared numbers: what the operator says the GPU and model hold (CI, laptops, planning).

Read once at start-up; the weights are measured from the model's files when SIDECAR_MODEL is a
directory and SIDECAR_WEIGHTS is unset or ``auto``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sidecar.core.errors import ConfigError
from sidecar.entry.settings import Settings


@dataclass(frozen=True)
class Declared:
    """Numbers that do not change while the sidecar runs; ``weights_measured`` says where from."""

    vram_total_bytes: int | None
    weights_bytes: int | None
    weights_measured: bool
    overhead_bytes: int
    kv_pool_bytes: int | None
    observed_at: float
    provenance: str = "static"

    @property
    def plannable(self) -> bool:
        """Whether these numbers alone make a plan (the static source, and the floor)."""
        return self.kv_pool_bytes is not None or (
            self.vram_total_bytes is not None and self.weights_bytes is not None
        )


def declared_from(
    settings: Settings, now: float, weights_in: Callable[[Path], int] | None = None
) -> Declared:
    """Collect the declared numbers; measure the weights from the model directory where we can."""
    weights: int | None = None if settings.weights in (None, "auto") else int(settings.weights)
    measured = False
    model_dir = Path(settings.model) if settings.model else None
    if weights is None and model_dir is not None and model_dir.is_dir():
        weights = _measure(model_dir, weights_in)
        measured = weights is not None
    return Declared(
        vram_total_bytes=None if settings.vram_total is None else int(settings.vram_total),
        weights_bytes=weights,
        weights_measured=measured,
        overhead_bytes=int(settings.overhead),
        kv_pool_bytes=None if settings.kv_pool is None else int(settings.kv_pool),
        observed_at=now,
    )


def _measure(model_dir: Path, weights_in: Callable[[Path], int] | None) -> int | None:
    """The weight files' size; None (not fatal: the engine source needs no weights) if none."""
    if weights_in is None:
        from sidecar.core.model_spec import weights_bytes_in

        weights_in = weights_bytes_in
    try:
        size = weights_in(model_dir)
    except ConfigError:
        return None
    return size if size > 0 else None
