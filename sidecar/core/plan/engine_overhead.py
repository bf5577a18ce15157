"""What vLLM holds on each GPU besides the weights and the KV cache, estimated from the model's
shape and vLLM's settings instead of a fixed figure.

vLLM sizes its pool as total x gpu_memory_utilization - weights - (torch peak of a profiling
forward over max_num_batched_tokens tokens, then a sampler run over max_num_seqs rows) - the
non-torch memory the profile added - (since 0.11) the CUDA graphs it will capture
(vllm/v1/worker/gpu_worker.py, determine_available_memory). Each part comes back as a Term
marked estimated, with its arithmetic in the detail. docs/capacity-math.md checks the sum
against vLLM's own start-up logs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.errors import ConfigError
from sidecar.core.plan.capacity import Source, Term
from sidecar.core.plan.model_shape import ModelShape

MIB = 1024**2
# The non-torch memory vLLM's profile counts (NCCL, cuBLAS workspaces that appear during the
# run; the CUDA context predates the baseline): 0.13 to 0.35 GiB in the published logs, with
# TP 1 and TP 2 alike (docs/capacity-math.md). A middle figure, not fitted to any one log.
NON_TORCH_BYTES = 256 * MIB
# The sampler's dummy run (top-k and top-p on, vllm/v1/worker/gpu_model_runner.py,
# _dummy_sampler_run) holds per logit: float32 logits and their temperature-scaled copy (4 + 4 B),
# the top-k/top-p sort's values and int64 indices (4 + 8 B), the softmax and cumulative sum over
# them (4 + 4 B), and masks and the scattered result (~4 B). One log shows 34 B: the rank that
# samples held 1.23 GiB more than the one that does not, for 256 x 152,064 logits (vllm#13061).
SAMPLER_BYTES_PER_LOGIT = 32
# vLLM captures CUDA graphs for batches up to 512 tokens unless max_num_seqs is smaller
# (vllm/config/compilation.py, max_cudagraph_capture_size).
MAX_CAPTURE_TOKENS = 512


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """The vLLM settings the overhead depends on."""

    max_num_batched_tokens: int
    max_num_seqs: int
    tp: int = 1
    cuda_graphs: bool = True  # False: --enforce-eager, no graphs captured
    sampler: bool = True  # False: the priced GPU is in a pipeline stage before the last

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "tp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")


def overhead_parts(shape: ModelShape, settings: EngineSettings) -> tuple[Term, ...]:
    """The estimated parts of one GPU's overhead: the profiling run's activation peak, non-torch
    memory and CUDA graphs (0 under --enforce-eager)."""
    non_torch = Term(
        name="non_torch",
        bytes=NON_TORCH_BYTES,
        source=Source.ESTIMATED,
        detail="NCCL and cuBLAS memory the profile adds: 0.13-0.35 GiB in vLLM's logs",
    )
    return (activation_peak(shape, settings), non_torch, graph_memory(shape, settings))


def activation_peak(shape: ModelShape, settings: EngineSettings) -> Term:
    """Torch's peak over the profiling run: the forward over max_num_batched_tokens, or the
    sampler's run over max_num_seqs rows beside the forward's kept output, whichever is larger
    (the forward's transients are freed before the sampler runs)."""
    tokens, seqs = settings.max_num_batched_tokens, settings.max_num_seqs
    per_token = shape.forward_bytes_per_token(settings.tp)
    forward = tokens * per_token
    widths = f"3 x hidden {shape.hidden:,} + MLP {shape.mlp_width(settings.tp):,}"
    detail = (
        f"forward: {tokens:,} batched tokens x {per_token:,} B ({widths}, x {shape.dtype_bytes} B)"
    )
    if not settings.sampler:
        return Term(
            name="activation_peak",
            bytes=forward,
            source=Source.ESTIMATED,
            detail=f"{detail}; no sampler",
        )
    logits = seqs * shape.vocab * SAMPLER_BYTES_PER_LOGIT
    sampler = tokens * shape.hidden * shape.dtype_bytes + logits
    detail += (
        f" = {forward:,} B, or sampler: {seqs:,} sequences x vocab {shape.vocab:,} x "
        f"{SAMPLER_BYTES_PER_LOGIT} B beside the kept output = {sampler:,} B; the larger"
    )
    return Term(
        name="activation_peak", bytes=max(forward, sampler), source=Source.ESTIMATED, detail=detail
    )


def graph_memory(shape: ModelShape, settings: EngineSettings) -> Term:
    """CUDA graphs: the forward's activations at the largest captured batch. A floor: the logs
    show 0.09-1.34 GiB; declare --cuda-graph-memory where the engine's log tells it."""
    if not settings.cuda_graphs:
        return Term(
            name="cuda_graphs", bytes=0, source=Source.DECLARED, detail="--enforce-eager: no graphs"
        )
    tokens = min(MAX_CAPTURE_TOKENS, settings.max_num_seqs)
    per_token = shape.forward_bytes_per_token(settings.tp)
    detail = f"largest captured batch {tokens:,} tokens x {per_token:,} B (a floor)"
    return Term(
        name="cuda_graphs", bytes=tokens * per_token, source=Source.ESTIMATED, detail=detail
    )


def overhead_total(parts: tuple[Term, ...]) -> Term:
    """The overhead term the pool subtracts: its parts summed, estimated if any part is."""
    estimated = any(part.source is Source.ESTIMATED for part in parts)
    return Term(
        name="overhead",
        bytes=sum(part.bytes for part in parts),
        source=Source.ESTIMATED if estimated else Source.DECLARED,
        detail=" + ".join(part.name for part in parts),
    )
