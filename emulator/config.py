"""The emulated engine's configuration: model limits, KV pool geometry and pacing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# The engines whose metrics the emulator speaks (--engine).
ENGINES = ("vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class EmulatorConfig:
    """What the emulated engine looks like; derived KV figures follow vLLM's cache_config_info.

    ``engine`` is whose metrics and endpoints it speaks. As llama.cpp, ``max_num_seqs`` is its
    slot count (-np), ``max_model_len`` the context of one slot, and it never preempts: a pool
    that runs dry fails its requests, as ``oom`` does.
    """

    engine: str = "vllm"
    model_name: str = "emulated-llama"
    max_model_len: int = 4096
    kv_tokens: int = 16384
    block_size: int = 16
    max_num_seqs: int = 64
    # vLLM's per-step token budget; with chunked prefill a longer prompt takes several steps.
    # 8192 is vLLM's default for the OpenAI server on a large GPU.
    max_num_batched_tokens: int = 8192
    tokens_per_s: float = 0.0  # each stream's decode rate when no prefill shares the step; 0: max
    # Engine compute: every token a step computes (prompt, recompute, decode) adds 1/this to the
    # step, so prefills slow every running stream. 0: free (no compute limit).
    prefill_tokens_per_s: float = 0.0
    ttft_s: float = 0.0  # a fixed delay before a request reaches the engine's queue
    # vLLM's --max-num-queued-reqs: at most this many unfinished requests (waiting + running);
    # the next is answered 503 at once. None: no cap (vLLM's default).
    max_num_queued_reqs: int | None = None
    oom: bool = False
    bytes_per_token: int = 1024
    gpu_memory_utilization: float = 0.9
    # Completion lengths hidden from clients: lognormal with median max_tokens x this (None: every
    # completion runs to max_tokens), spread sigma, capped at max_tokens, from a seeded generator.
    completion_median_ratio: float | None = None
    completion_sigma: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        positive = (
            "max_model_len",
            "kv_tokens",
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "bytes_per_token",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_num_queued_reqs is not None and self.max_num_queued_reqs < 0:
            raise ValueError(
                f"max_num_queued_reqs must not be negative, got {self.max_num_queued_reqs}"
            )
        ratio = self.completion_median_ratio
        if ratio is not None and not 0 < ratio <= 1:
            raise ValueError(f"completion_median_ratio must be in (0, 1], got {ratio}")
        if min(self.tokens_per_s, self.prefill_tokens_per_s, self.ttft_s) < 0:
            raise ValueError("tokens_per_s, prefill_tokens_per_s and ttft_s must not be negative")
        # vLLM refuses to start when one max_model_len request cannot fit the pool; so do we,
        # which also guarantees a lone request can always make progress.
        if self.kv_cache_size_tokens < self.max_model_len:
            raise ValueError(
                f"KV pool of {self.kv_cache_size_tokens} tokens cannot hold one request of "
                f"max_model_len={self.max_model_len} tokens"
            )

    @classmethod
    def from_blocks(cls, num_gpu_blocks: int, block_size: int, **kwargs: Any) -> EmulatorConfig:
        """Size the pool in blocks, as vLLM's --num-gpu-blocks-override does."""
        return cls(kv_tokens=num_gpu_blocks * block_size, block_size=block_size, **kwargs)

    def replace(self, **changes: Any) -> EmulatorConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def fails_on_overflow(self) -> bool:
        """True where a dry pool fails requests instead of preempting (--oom, llama.cpp)."""
        return self.oom or self.engine == "llamacpp"

    @property
    def num_gpu_blocks(self) -> int:
        """Whole blocks in the pool; a partial block at the end is unusable, as in vLLM."""
        return self.kv_tokens // self.block_size

    @property
    def kv_cache_size_tokens(self) -> int:
        """Tokens the pool holds."""
        return self.num_gpu_blocks * self.block_size

    @property
    def kv_cache_memory_bytes(self) -> int:
        """Bytes the simulated pool occupies."""
        return self.kv_cache_size_tokens * self.bytes_per_token

    @property
    def kv_cache_max_concurrency(self) -> float:
        """How many max_model_len requests fit at once (vLLM's 'Maximum concurrency')."""
        return self.kv_cache_size_tokens / self.max_model_len
