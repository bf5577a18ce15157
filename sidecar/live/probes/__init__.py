"""What the sidecar can observe: GPU memory (NVML), the engine's KV cache (vLLM, SGLang, llama.cpp),
declared numbers.

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


@dataclass(frozen=True, kw_only=True)
class EngineCacheConfig:
    """The engine's KV pool as the engine itself states it, in vLLM's terms (the labels of
    ``vllm:cache_config_info``); SGLang and llama.cpp fill the same fields from their own figures
    (their probes say how). ``block_size`` is SGLang's page size."""

    num_gpu_blocks: int | None
    block_size: int | None
    kv_cache_size_tokens: int | None
    kv_cache_memory_bytes: int | None
    cache_dtype: str | None
    gpu_memory_utilization: float | None

    @property
    def pool_tokens(self) -> int | None:
        """The pool in tokens: kv_cache_size_tokens, else num_gpu_blocks x block_size."""
        if self.kv_cache_size_tokens is not None:
            return self.kv_cache_size_tokens
        if self.num_gpu_blocks is not None and self.block_size is not None:
            return self.num_gpu_blocks * self.block_size
        return None

    @property
    def bytes_per_token(self) -> int | None:
        """What the engine's allocator spends per token: its pool bytes / its pool tokens."""
        tokens = self.pool_tokens
        if self.kv_cache_memory_bytes is None or not tokens:
            return None
        return round(self.kv_cache_memory_bytes / tokens)


@dataclass(frozen=True, kw_only=True)
class EngineReading:
    """The engine's own view of its KV cache and load, one shape for every engine it can read.

    ``engine`` names the dialect it was read in (``vllm``, ``sglang``, ``llamacpp``). Counts are
    summed over the engine's data-parallel ranks. ``preemptions_total`` is a counter of requests
    the engine evicted to make room (vLLM: preemptions; SGLang: retractions); None where the engine
    never preempts (llama.cpp), which keeps adaptive admission at the worst case.
    ``max_model_len`` is the longest request (prompt + completion) one sequence may hold (llama.cpp:
    the context of one slot); ``slots`` is a fixed number of sequences the engine runs at once,
    where it has one (llama.cpp's ``-np``).
    """

    cache: EngineCacheConfig | None
    kv_usage_ratio: float | None  # 0..1 of the pool
    requests_running: float | None
    requests_waiting: float | None
    preemptions_total: float | None
    observed_at: float
    provenance: str = "vllm"
    served_model: str | None = None  # the first model of the engine's GET /v1/models
    engine: str = "vllm"
    max_model_len: int | None = None
    slots: int | None = None
    # Mean prompt and completion lengths of the requests the engine finished (vLLM's
    # request_prompt_tokens / request_generation_tokens histograms), where it has served any.
    typical_prompt_tokens: float | None = None
    typical_generation_tokens: float | None = None
    # Mean time a finished request ran, prefill and decode, its wait in the engine's queue aside
    # (vLLM's request_inference_time_seconds histogram), where it has served any.
    typical_inference_s: float | None = None
    # The same histogram's quantiles, evenly spaced ((i + 0.5) / n of them), ascending: how the
    # time requests hold their place is spread (empty where the engine has no buckets of it).
    inference_quantiles_s: tuple[float, ...] = ()

    @property
    def pool_tokens(self) -> int | None:
        """The engine's KV pool in tokens, where it states one."""
        return None if self.cache is None else self.cache.pool_tokens

    @property
    def block_size(self) -> int | None:
        """Tokens per block (vLLM) or page (SGLang); None where the engine does not page."""
        return None if self.cache is None else self.cache.block_size

    @property
    def bytes_per_token(self) -> int | None:
        """The engine's own bytes per token of KV, where it states its pool in bytes."""
        return None if self.cache is None else self.cache.bytes_per_token


class GpuProbe(Protocol):
    """Reads GPU memory; raises ProbeError when it cannot."""

    async def read(self) -> GpuSnapshot: ...

    async def close(self) -> None: ...


class EngineProbe(Protocol):
    """Reads the engine's metrics; raises ProbeError when it cannot."""

    async def read(self) -> EngineReading: ...

    async def close(self) -> None: ...
