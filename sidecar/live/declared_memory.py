"""The operator's declared numbers as plan inputs (the static source, and the floor), and the
terms the other sources take from them: the weights and the engine's memory fraction."""

from __future__ import annotations

from sidecar.core.errors import ProbeUnavailableError
from sidecar.core.plan.capacity import MemoryFraction, MemoryInputs, Source, Term
from sidecar.live.probes.static import Declared


def static_memory(declared: Declared) -> MemoryInputs | Term:
    """The declared numbers as plan inputs (the static source, and the floor)."""
    if declared.kv_pool_bytes is not None:
        return Term(
            name="kv_pool",
            bytes=declared.kv_pool_bytes,
            source=Source.DECLARED,
            observed_at=declared.observed_at,
        )
    if declared.vram_total_bytes is None or declared.weights_bytes is None:
        msg = "the static source needs SIDECAR_KV_POOL, or SIDECAR_VRAM_TOTAL and the weights"
        raise ProbeUnavailableError(msg)
    at = declared.observed_at
    return MemoryInputs(
        vram_total=Term(
            name="vram_total",
            bytes=declared.vram_total_bytes,
            source=Source.DECLARED,
            observed_at=at,
        ),
        weights=weights_term(declared),
        overhead=Term(
            name="overhead", bytes=declared.overhead_bytes, source=Source.DECLARED, observed_at=at
        ),
        neighbours=Term(name="neighbours", bytes=0, source=Source.DECLARED, observed_at=at),
        fraction=declared_fraction(declared),
    )


def declared_fraction(declared: Declared) -> MemoryFraction:
    """SIDECAR_ENGINE_MEMORY_FRACTION, else vLLM's default."""
    if declared.memory_fraction is not None:
        return MemoryFraction(declared.memory_fraction, Source.DECLARED)
    return MemoryFraction()


def weights_term(declared: Declared) -> Term:
    source = Source.MEASURED if declared.weights_measured else Source.DECLARED
    return Term(
        name="weights",
        bytes=declared.weights_bytes or 0,
        source=source,
        observed_at=declared.observed_at,
    )
