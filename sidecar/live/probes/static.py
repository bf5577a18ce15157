"""Declared numbers: what the operator says the GPU and model hold (CI, laptops, planning).

Read once at start-up (the composition root collects them from the settings); the weights are
measured from the model's files when SIDECAR_MODEL is a directory and SIDECAR_WEIGHTS is unset or
``auto``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Declared:
    """Numbers that do not change while the sidecar runs; ``weights_measured`` says where from."""

    vram_total_bytes: int | None
    weights_bytes: int | None
    weights_measured: bool
    overhead_bytes: int
    kv_pool_bytes: int | None
    observed_at: float
    provenance: str = "static"
    memory_fraction: float | None = None  # SIDECAR_ENGINE_MEMORY_FRACTION; None: not declared

    @property
    def plannable(self) -> bool:
        """Whether these numbers alone make a plan (the static source, and the floor)."""
        return self.kv_pool_bytes is not None or (
            self.vram_total_bytes is not None and self.weights_bytes is not None
        )
