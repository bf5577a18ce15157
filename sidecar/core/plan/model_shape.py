"""How wide a model's forward pass is, as its config.json says: the widths vLLM's profiling run
allocates activations by (hidden size, MLP or experts, vocabulary).

Pure: a parsed config.json in, a ModelShape out (None when the config does not tell the widths).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sidecar.core.plan.config_json import DTYPE_BYTES, text_part

# Activations of a config that names no dtype are taken as 16-bit, as vLLM's default is.
DEFAULT_ACTIVATION_BYTES = 2


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The widths that size one token's activations on one GPU."""

    hidden: int
    dense_intermediate: int | None  # None: every layer is a mixture of experts
    expert_intermediate: int | None  # None: no experts
    experts_per_token: int
    vocab: int
    dtype_bytes: int

    def mlp_width(self, tp: int) -> int:
        """Elements per token of the widest MLP transient on one GPU: a dense MLP's gate-up
        output (2 x I / TP) beside its activation (I / TP); a fused MoE's per-expert gate-up,
        activation and output (top-k x (3 x I / TP + hidden), vLLM's fused_moe caches)."""
        widths = [0]
        if self.dense_intermediate:
            widths.append(3 * math.ceil(self.dense_intermediate / tp))
        if self.expert_intermediate:
            per_expert = 3 * math.ceil(self.expert_intermediate / tp) + self.hidden
            widths.append(self.experts_per_token * per_expert)
        return max(widths)

    def forward_bytes_per_token(self, tp: int) -> int:
        """Bytes one batched token holds at the forward's peak on one GPU: three hidden-wide
        tensors (the residual stream, the normed input, the layer's output before it joins the
        residual) beside the widest MLP transient."""
        return self.dtype_bytes * (3 * self.hidden + self.mlp_width(tp))


def shape_from_config(cfg: dict[str, Any]) -> ModelShape | None:
    """A ModelShape from a parsed config.json; None when it lacks the hidden size, MLP width or
    vocabulary (the estimate then cannot be made and a stated default stands in)."""
    text = text_part(cfg)
    hidden, vocab = _int(text, "hidden_size"), _int(text, "vocab_size")
    per_token = _int(text, "num_experts_per_tok") or _int(text, "experts_per_token")
    routed = any(
        _int(text, key) for key in ("num_experts", "num_local_experts", "n_routed_experts")
    )
    # Qwen-MoE and DeepSeek name the expert width apart; Mixtral, gpt-oss and Jamba use
    # intermediate_size for it.
    expert = (
        (_int(text, "moe_intermediate_size") or _int(text, "intermediate_size"))
        if (routed and per_token)
        else None
    )
    dense = _int(text, "intermediate_size") if _has_dense_layers(text, expert) else None
    if hidden is None or vocab is None or (dense is None and expert is None):
        return None
    dtype = str(text.get("torch_dtype") or text.get("dtype") or "").removeprefix("torch.")
    return ModelShape(
        hidden=hidden,
        dense_intermediate=dense,
        expert_intermediate=expert,
        experts_per_token=per_token or 0,
        vocab=vocab,
        dtype_bytes=DTYPE_BYTES.get(dtype, DEFAULT_ACTIVATION_BYTES),
    )


def _has_dense_layers(cfg: dict[str, Any], expert: int | None) -> bool:
    """A dense MLP runs somewhere: no experts at all, DeepSeek's first_k_dense_replace layers,
    Qwen-MoE's mlp_only_layers, or Jamba's layers between expert layers."""
    if expert is None:
        return True
    period = _int(cfg, "expert_layer_period") or 1
    return bool(cfg.get("first_k_dense_replace") or cfg.get("mlp_only_layers")) or period > 1


def _int(cfg: dict[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value
