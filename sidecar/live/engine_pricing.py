"""The engine's own KV pool and what a token costs in it: the engine's figures
(``vllm:cache_config_info``) against the model config's, the engine's winning where they disagree.
Pure: the engine's cache config in, a pool and a pricing out."""

from __future__ import annotations

from sidecar.core.errors import ProbeUnavailableError
from sidecar.core.plan.capacity import KvCost, engine_cost
from sidecar.core.warnings import ConfigWarning, model_mismatch
from sidecar.live.probes import EngineCacheConfig


def engine_pool_per_gpu(cache: EngineCacheConfig, cost: KvCost) -> int | None:
    """The engine's KV pool on one GPU: its token count x our bytes/token, else its own bytes."""
    if cache.kv_cache_size_tokens is not None:
        return cache.kv_cache_size_tokens * cost.bytes_per_token_per_gpu
    if cache.num_gpu_blocks is not None and cache.block_size is not None:
        return cache.num_gpu_blocks * cache.block_size * cost.bytes_per_token_per_gpu
    return cache.kv_cache_memory_bytes


def engine_pricing(
    cache: EngineCacheConfig, cost: KvCost | None, tolerance: float
) -> tuple[KvCost, tuple[ConfigWarning, ...]]:
    """The cost to plan with: the model config's where it agrees with the engine, else the
    engine's own bytes per token (and a model_mismatch warning when they disagree)."""
    engine_bytes = cache.bytes_per_token
    if cost is None:
        if engine_bytes is None and cache.pool_tokens is None:
            raise ProbeUnavailableError("the engine gives no pool in tokens; set SIDECAR_MODEL")
        # Tokens without bytes: plan in tokens, each counted as one byte.
        return engine_cost(engine_bytes or 1, cache.block_size), ()
    block = cost.block_size
    if engine_bytes is None:
        return cost, ()
    ours = cost.bytes_per_token_per_gpu
    if abs(ours - engine_bytes) / engine_bytes <= tolerance:
        return cost, ()
    return engine_cost(engine_bytes, block, cost.spec.name), (
        model_mismatch(ours, engine_bytes, tolerance),
    )
