"""The capacity math: KV bytes per token and per request, the KV pool, and the permits that fit.

Pure: values in, frozen dataclasses out; every byte count is an int and every ratio a Fraction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

from sidecar.core.errors import ConfigError, PlanError
from sidecar.core.exact import exact
from sidecar.core.plan.config_json import DTYPE_BYTES, LayerKind, ModelSpec
from sidecar.core.plan.parallelism import check_tensor_parallel, fullest_pipeline_stage


class Source(StrEnum):
    """Where a number in the plan came from; docs/capacity-math.md explains each word."""

    DECLARED = "declared"  # the user gave it: a flag or a SIDECAR_* setting
    DEFAULT = "default"  # nobody gave it: the built-in default stands in
    PRESET = "preset"  # a built-in preset's published figure
    MEASURED = "measured"  # read from this machine: NVML, or the model's files on disk
    ENGINE = "engine"  # the inference engine reported it
    DERIVED = "derived"  # computed from other terms
    ESTIMATED = "estimated"  # modelled from the model's shape and the engine's settings


@dataclass(frozen=True, kw_only=True)
class Term:
    """One term of the capacity formula, with its provenance and (for live readings) its time."""

    name: str
    bytes: int
    source: Source
    observed_at: float | None = None
    detail: str | None = None  # which file, preset or figure the number was taken from

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "bytes": self.bytes,
            "source": str(self.source),
            "detail": self.detail,
            "observed_at": self.observed_at,
        }


@dataclass(frozen=True)
class Budget:
    """The most tokens one request may hold: its prompt plus its completion, within the engine's
    context (``max_model_len``) where it is known: the engine never runs a sequence past it."""

    prompt_tokens: int
    completion_tokens: int
    context_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 0 or self.completion_tokens < 0 or self.total <= 0:
            msg = (
                f"token budget must be positive, got {self.prompt_tokens} prompt + "
                f"{self.completion_tokens} completion tokens"
            )
            raise ConfigError(msg)

    @property
    def total(self) -> int:
        """Prompt and completion tokens together (at most the context)."""
        both = self.prompt_tokens + self.completion_tokens
        return both if self.context_tokens is None else min(both, self.context_tokens)


def kv_dtype_bytes(kv_dtype: str, spec: ModelSpec) -> int:
    """Bytes per KV element: "auto" is the model's dtype, any fp8 variant is one byte."""
    name = kv_dtype.strip().lower()
    if name == "auto":
        if spec.dtype_bytes is None:
            msg = f"{spec.name}: config.json gives no torch_dtype; pass --kv-dtype (e.g. bf16)"
            raise ConfigError(msg)
        return spec.dtype_bytes
    if name.startswith("fp8"):
        return 1
    if name in DTYPE_BYTES:
        return DTYPE_BYTES[name]
    known = ", ".join(["auto", "fp8 (any variant)", *DTYPE_BYTES])
    raise ConfigError(f"unknown KV cache dtype {kv_dtype!r} (known: {known})")


@dataclass(frozen=True, kw_only=True)
class KvCost:
    """What tokens cost in KV cache for one model, cache dtype, TP degree and block size.

    "Whole model" figures add up every GPU of the tensor-parallel group, replicas included.
    With pipeline stages (pp > 1), "per GPU" is a GPU of the stage holding the most layers.
    """

    spec: ModelSpec
    kv_dtype: str = "auto"
    tp: int = 1
    block_size: int | None = None
    pp: int = 1
    element_bytes: int = field(init=False)
    # How many layers of each attention kind the fullest GPU holds: every layer of a kind holds
    # the same per token, so a request is priced per kind, not per layer.
    _full_layers: int = field(init=False, repr=False, compare=False)
    _sliding_layers: int = field(init=False, repr=False, compare=False)
    _state_share: Fraction = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ConfigError(f"tensor parallel size must be at least 1, got {self.tp}")
        if self.block_size is not None and self.block_size < 1:
            raise ConfigError(f"block size must be at least 1 token, got {self.block_size}")
        check_tensor_parallel(self.spec, self.tp)
        stage = fullest_pipeline_stage(self.spec.layers, self.pp)
        states = self.spec.layers.count(LayerKind.STATE)
        share = Fraction(stage.count(LayerKind.STATE), states) if states else Fraction(0)
        object.__setattr__(self, "element_bytes", kv_dtype_bytes(self.kv_dtype, self.spec))
        object.__setattr__(self, "_full_layers", stage.count(LayerKind.FULL))
        object.__setattr__(self, "_sliding_layers", stage.count(LayerKind.SLIDING))
        object.__setattr__(self, "_state_share", share)

    @property
    def layer_bytes_per_token_per_gpu(self) -> int:
        """One token in one attention layer on one GPU."""
        if self.spec.mla_latent_dim is not None:  # one latent, replicated on every rank
            return self.spec.mla_latent_dim * self.element_bytes
        heads_per_gpu = max(1, math.ceil(self.spec.num_kv_heads / self.tp))
        return 2 * heads_per_gpu * self.spec.head_dim * self.element_bytes

    @property
    def attention_layers_per_gpu(self) -> int:
        """Attention layers on the fullest GPU: all of them, or the fullest pipeline stage's."""
        return self._full_layers + self._sliding_layers

    @property
    def bytes_per_token_per_gpu(self) -> int:
        """One token across every attention layer, on the fullest GPU."""
        return self.attention_layers_per_gpu * self.layer_bytes_per_token_per_gpu

    @property
    def bytes_per_token(self) -> int:
        """One token across every attention layer, all GPUs of the group together."""
        return self.spec.attention_layers * self.layer_bytes_per_token_per_gpu * self.tp

    @property
    def state_bytes_per_gpu(self) -> int:
        """Constant mamba / linear-attention state of one request on one GPU."""
        return math.ceil(self.spec.state_bytes_per_request * self._state_share / self.tp)

    def tokens_held(self, kind: LayerKind, tokens: int) -> int:
        """Token slots a request of `tokens` occupies in one layer of `kind`, in whole blocks."""
        block = self.block_size or 1
        blocks = math.ceil(tokens / block)
        window = self.spec.sliding_window
        if kind is LayerKind.SLIDING and window is not None:
            # A window that starts mid-block straddles one more block than it fills.
            blocks = min(blocks, math.ceil((window - 1) / block) + 1)
        return blocks * block

    def request_bytes_per_gpu(self, tokens: int) -> int:
        """Worst case of one request of `tokens` on the fullest GPU: the token slots it holds in
        every attention layer, at one layer's bytes per token, and its constant state."""
        slots = self._full_layers * self.tokens_held(LayerKind.FULL, tokens)
        if self._sliding_layers:
            slots += self._sliding_layers * self.tokens_held(LayerKind.SLIDING, tokens)
        return slots * self.layer_bytes_per_token_per_gpu + self.state_bytes_per_gpu

    def request_bytes(self, tokens: int) -> int:
        """Worst case of one request of `tokens`, all GPUs of the group together."""
        if self.pp == 1:
            return self.request_bytes_per_gpu(tokens) * self.tp
        whole = KvCost(
            spec=self.spec, kv_dtype=self.kv_dtype, tp=self.tp, block_size=self.block_size
        )
        return whole.request_bytes(tokens)

    def usable_pool_bytes_per_gpu(self, pool_bytes_per_gpu: int) -> int:
        """The part of a GPU's pool that whole blocks can use."""
        block_bytes = (self.block_size or 0) * self.bytes_per_token_per_gpu
        if block_bytes == 0:  # no paging: every byte counts
            return max(0, pool_bytes_per_gpu)
        return max(0, pool_bytes_per_gpu) // block_bytes * block_bytes

    def tokens_in_pool(self, pool_bytes_per_gpu: int) -> int:
        """How many tokens (in whole blocks) a GPU's pool holds."""
        if self.bytes_per_token_per_gpu == 0:
            return 0
        return self.usable_pool_bytes_per_gpu(pool_bytes_per_gpu) // self.bytes_per_token_per_gpu


def engine_cost(bytes_per_token: int, block_size: int | None, name: str = "engine") -> KvCost:
    """The engine's own pricing, for when no model config is given or the engine overrules it:
    one flat layer of ``bytes_per_token`` per token (1 B elements, one latent, as MLA is shaped)."""
    spec = ModelSpec(
        name=name,
        model_type="engine",
        layers=(LayerKind.FULL,),
        num_attention_heads=1,
        num_kv_heads=1,
        head_dim=max(1, bytes_per_token),
        mla_latent_dim=max(1, bytes_per_token),
        sliding_window=None,
        dtype="int8",
        state_bytes_per_request=0,
        max_position_embeddings=None,
    )
    return KvCost(spec=spec, kv_dtype="auto", tp=1, block_size=block_size)


_NO_NEIGHBOURS = Term(name="neighbours", bytes=0, source=Source.DEFAULT)

# vLLM's default --gpu-memory-utilization: the share of each GPU it sizes itself to.
DEFAULT_MEMORY_FRACTION = 0.9


@dataclass(frozen=True)
class MemoryFraction:
    """The share of each GPU the engine sizes itself to (vLLM's ``gpu_memory_utilization``,
    SGLang's ``mem_fraction_static``), and who said it."""

    value: float = DEFAULT_MEMORY_FRACTION
    source: Source = Source.DEFAULT

    def __post_init__(self) -> None:
        if not 0 < self.value <= 1:  # also rejects NaN
            raise ConfigError(f"the engine's memory fraction must be in (0, 1], got {self.value}")

    def of(self, total_bytes: int) -> int:
        """The engine's share of ``total_bytes``, rounded down to a byte."""
        return math.floor(exact(self.value) * total_bytes)


WHOLE_GPU = MemoryFraction(1.0, Source.DECLARED)


@dataclass(frozen=True, kw_only=True)
class MemoryInputs:
    """GPU memory split: VRAM, the engine's share of it, overhead and neighbours per GPU; weights
    for the whole model. The engine sizes its pool inside its share (vLLM: requested memory =
    total x gpu_memory_utilization; KV = requested - weights - activations - non-torch memory)."""

    vram_total: Term
    weights: Term
    overhead: Term
    neighbours: Term = _NO_NEIGHBOURS
    fraction: MemoryFraction = WHOLE_GPU
    # What `overhead` adds up, when it was estimated part by part: shown, not subtracted again.
    overhead_parts: tuple[Term, ...] = ()

    def engine_share(self) -> Term:
        """vram_total x the memory fraction: what the engine sizes weights, overhead and KV in."""
        detail = f"vram_total x memory fraction {self.fraction.value} ({self.fraction.source})"
        return Term(
            name="engine_share",
            bytes=self.fraction.of(self.vram_total.bytes),
            source=Source.DERIVED,
            detail=detail,
        )

    def pool_terms(self, tp: int) -> tuple[Term, ...]:
        """Every term of the formula, ending with the derived KV pool of one GPU."""
        weights_per_gpu = Term(
            name="weights_per_gpu", bytes=math.ceil(self.weights.bytes / tp), source=Source.DERIVED
        )
        share = self.engine_share()
        taken = weights_per_gpu.bytes + self.overhead.bytes + self.neighbours.bytes
        if taken >= share.bytes:
            msg = (
                f"no room for a KV cache: weights per GPU {weights_per_gpu.bytes:,} B + overhead "
                f"{self.overhead.bytes:,} B + neighbours {self.neighbours.bytes:,} B = {taken:,} B"
                f" >= {_share_text(share, self.vram_total)}"
            )
            raise PlanError(msg)
        pool = Term(name="kv_pool_per_gpu", bytes=share.bytes - taken, source=Source.DERIVED)
        return (
            self.vram_total,
            share,
            self.weights,
            weights_per_gpu,
            self.overhead,
            *self.overhead_parts,
            self.neighbours,
            pool,
        )


def _share_text(share: Term, vram: Term) -> str:
    if share.bytes == vram.bytes:
        return f"VRAM {vram.bytes:,} B"
    return f"the engine's share {share.bytes:,} B ({share.detail} of {vram.bytes:,} B)"


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How many requests of the budget fit in the KV pool, with every number that led there."""

    permits: int
    permits_exact: Fraction  # before flooring, for the derivation
    kv_pool_bytes_per_gpu: int
    kv_pool_tokens: int  # per GPU, in whole blocks
    alpha: float
    budget: Budget
    cost: KvCost
    terms: tuple[Term, ...]
    memory_fraction: MemoryFraction | None = None  # None: the pool was given, not derived

    @property
    def kv_pool_bytes(self) -> int:
        """The pool of the whole TP group (with tp=1, the GPU's pool)."""
        return self.kv_pool_bytes_per_gpu * self.cost.tp

    @property
    def kv_bytes_per_token(self) -> int:
        """One token across every attention layer of the whole model."""
        return self.cost.bytes_per_token

    @property
    def request_max_tokens(self) -> int:
        """The token budget of one request."""
        return self.budget.total

    @property
    def request_max_bytes(self) -> int:
        """One request's worst case, whole model, windows and blocks honoured."""
        return self.cost.request_bytes(self.budget.total)

    @property
    def admissible_bytes(self) -> int:
        """floor(alpha x pool): the limit for token-weighted admission, whole group."""
        return math.floor(exact(self.alpha) * self.kv_pool_bytes)

    def _inputs(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "max_prompt_tokens": self.budget.prompt_tokens,
            "max_completion_tokens": self.budget.completion_tokens,
            "engine_max_model_len": self.budget.context_tokens,
            "kv_dtype": self.cost.kv_dtype,
            "kv_dtype_bytes": self.cost.element_bytes,
            "tensor_parallel_size": self.cost.tp,
            "pipeline_parallel_size": self.cost.pp,
            "block_size_tokens": self.cost.block_size,
            "memory_fraction": None if self.memory_fraction is None else self.memory_fraction.value,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; key suffixes carry units (_bytes, _tokens)."""
        spec = self.cost.spec
        return {
            "model": spec.name,
            "model_type": spec.model_type,
            "permits": self.permits,
            "permits_exact": float(self.permits_exact),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.cost.bytes_per_token_per_gpu,
            "request_max_tokens": self.request_max_tokens,
            "request_max_bytes": self.request_max_bytes,
            "request_max_bytes_per_gpu": self.cost.request_bytes_per_gpu(self.budget.total),
            "kv_pool_bytes": self.kv_pool_bytes,
            "kv_pool_bytes_per_gpu": self.kv_pool_bytes_per_gpu,
            "kv_pool_tokens": self.kv_pool_tokens,
            "admissible_bytes": self.admissible_bytes,
            "inputs": self._inputs(),
            "model_spec": _spec_dict(spec),
            "terms": [term.to_dict() for term in self.terms],
        }


def _spec_dict(spec: ModelSpec) -> dict[str, Any]:
    return {
        "attention_layers": spec.attention_layers,
        "layers": len(spec.layers),
        "num_kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "mla_latent_dim": spec.mla_latent_dim,
        "sliding_window_tokens": spec.sliding_window,
        "dtype": spec.dtype,
        "state_bytes_per_request": spec.state_bytes_per_request,
    }


def make_plan(cost: KvCost, memory: MemoryInputs | Term, budget: Budget, alpha: float) -> Plan:
    """Work out the permits: floor(usable pool per GPU / request bytes per GPU x alpha)."""
    if not 0 < alpha <= 1:  # also rejects NaN
        raise ConfigError(f"alpha (safety factor) must be in (0, 1], got {alpha}")
    terms = (memory,) if isinstance(memory, Term) else memory.pool_terms(cost.tp * cost.pp)
    pool = terms[-1].bytes
    if pool <= 0:
        raise PlanError(f"the KV pool must be positive, got {pool:,} B")
    request = cost.request_bytes_per_gpu(budget.total)
    if request == 0:
        raise PlanError(f"{cost.spec.name} keeps no per-request state to size permits by")
    permits = Fraction(cost.usable_pool_bytes_per_gpu(pool)) / request * exact(alpha)
    return Plan(
        permits=math.floor(permits),
        permits_exact=permits,
        kv_pool_bytes_per_gpu=pool,
        kv_pool_tokens=cost.tokens_in_pool(pool),
        alpha=alpha,
        budget=budget,
        cost=cost,
        terms=terms,
        memory_fraction=None if isinstance(memory, Term) else memory.fraction,
    )
