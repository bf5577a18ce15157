"""What the sidecar can observe: GPU memory (NVML), the engine's KV cache (vLLM), declared numbers.

Every probe returns a frozen, timestamped reading that names where it came from; turning readings
into plan inputs is :mod:`sidecar.live.sources`' job, not the probes'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ProcessMemory:
    """One process holding memory on a GPU (host PID, as NVML reports it)."""

    pid: int
    used_bytes: int | None  # None where the driver cannot tell (NVML_VALUE_NOT_AVAILABLE)


@dataclass(frozen=True)
class GpuReading:
    """One GPU's memory as NVML saw it."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None  # only memory info v2 reports it
    processes: tuple[ProcessMemory, ...]
    mig_enabled: bool

    @property
    def unlisted_bytes(self) -> int:
        """Used memory that no listed process holds (driver-reserved or invisible processes)."""
        listed = sum(p.used_bytes or 0 for p in self.processes)
        return max(0, self.used_bytes - listed)


@dataclass(frozen=True)
class GpuSnapshot:
    """Every selected GPU, read together."""

    gpus: tuple[GpuReading, ...]
    observed_at: float
    provenance: str = "nvml"


@dataclass(frozen=True)
class EngineCacheConfig:
    """The labels of vLLM's ``vllm:cache_config_info`` that size the KV pool."""

    num_gpu_blocks: int | None
    block_size: int | None
    kv_cache_size_tokens: int | None
    kv_cache_memory_bytes: int | None
    cache_dtype: str | None
    gpu_memory_utilization: float | None


@dataclass(frozen=True)
class EngineReading:
    """The engine's own view of its KV cache and load, from its ``/metrics``."""

    cache: EngineCacheConfig | None
    kv_usage_ratio: float | None
    requests_running: float | None
    requests_waiting: float | None
    preemptions_total: float | None
    observed_at: float
    provenance: str = "vllm"


class GpuProbe(Protocol):
    """Reads GPU memory; raises ProbeError when it cannot."""

    async def read(self) -> GpuSnapshot: ...

    async def close(self) -> None: ...


class EngineProbe(Protocol):
    """Reads the engine's metrics; raises ProbeError when it cannot."""

    async def read(self) -> EngineReading: ...

    async def close(self) -> None: ...
