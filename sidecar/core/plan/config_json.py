"""What a model's KV cache looks like, as its Hugging Face config.json describes it.

Pure: a parsed config.json in, a ModelSpec out. Finding and reading the file is model_spec's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.core.errors import ModelConfigError

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "int8": 1,
    "uint8": 1,
}


class LayerKind(StrEnum):
    """What one decoder layer keeps per request."""

    FULL = "full_attention"  # K/V for every token
    SLIDING = "sliding_attention"  # K/V for at most the window
    STATE = "constant_state"  # mamba / linear attention: a fixed-size state
    NONE = "no_cache"  # MLP-only layers (NemotronH "-")


_LAYER_TYPE_NAMES = {
    "full_attention": LayerKind.FULL,
    "attention": LayerKind.FULL,
    "sliding_attention": LayerKind.SLIDING,
    "linear_attention": LayerKind.STATE,
    "mamba": LayerKind.STATE,
}


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The numbers that size a model's KV cache; one entry of `layers` per decoder layer."""

    name: str
    model_type: str
    layers: tuple[LayerKind, ...]
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    mla_latent_dim: int | None  # kv_lora_rank + qk_rope_head_dim for MLA models, else None
    sliding_window: int | None
    dtype: str | None  # the model's own dtype ("bfloat16"), None when the config does not say
    state_bytes_per_request: int  # all STATE layers together, whole model, in the model dtype
    max_position_embeddings: int | None

    @property
    def attention_layers(self) -> int:
        """Layers whose cache grows with tokens."""
        return sum(kind in (LayerKind.FULL, LayerKind.SLIDING) for kind in self.layers)

    @property
    def dtype_bytes(self) -> int | None:
        """Bytes per element of the model dtype, None when unknown."""
        return DTYPE_BYTES.get(self.dtype) if self.dtype else None


def spec_from_config(cfg: dict[str, Any], name: str) -> ModelSpec:
    """Read a ModelSpec from a parsed config.json; ModelConfigError names what is missing."""
    text = text_part(cfg)
    heads = _int(text, ("num_attention_heads", "n_head", "num_heads"), name)
    n_layers = _int(text, ("num_hidden_layers", "n_layer", "num_layers"), name)
    window = _sliding_window(text)
    layers = _layer_kinds(text, n_layers, window)
    dtype = _dtype(text)
    state = _state_elements_per_layer(text, name) if LayerKind.STATE in layers else 0
    if state and dtype is None:
        raise ModelConfigError(f"{name}: config has no torch_dtype to size its mamba state")
    mla = text.get("kv_lora_rank")
    return ModelSpec(
        name=name,
        model_type=str(text.get("model_type", "unknown")),
        layers=layers,
        num_attention_heads=heads,
        num_kv_heads=_kv_heads(text, heads),
        head_dim=_head_dim(text, heads, name),
        mla_latent_dim=int(mla) + int(text.get("qk_rope_head_dim", 0)) if mla else None,
        sliding_window=window if LayerKind.SLIDING in layers else None,
        dtype=dtype,
        state_bytes_per_request=state
        * layers.count(LayerKind.STATE)
        * DTYPE_BYTES.get(dtype or "", 0),
        max_position_embeddings=_optional_int(text, "max_position_embeddings"),
    )


def text_part(cfg: dict[str, Any]) -> dict[str, Any]:
    """The decoder's settings: multimodal configs nest them under text_config."""
    nested = cfg.get("text_config")
    if not isinstance(nested, dict):
        return cfg
    # The dtype often sits only at the top of a multimodal config.
    outer: dict[str, Any] = {key: cfg[key] for key in ("torch_dtype", "dtype") if key in cfg}
    return outer | nested


def _int(cfg: dict[str, Any], keys: tuple[str, ...], name: str) -> int:
    for key in keys:
        if cfg.get(key) is not None:
            return _positive(cfg[key], key, name)
    raise ModelConfigError(f"{name}: config.json has none of {', '.join(keys)}")


def _positive(value: Any, key: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelConfigError(f"{name}: {key} must be a positive integer, got {value!r}")
    return value


def _optional_int(cfg: dict[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _kv_heads(cfg: dict[str, Any], heads: int) -> int:
    if cfg.get("multi_query") is True and not cfg.get("new_decoder_architecture"):
        return 1  # Falcon-7B, GPT-BigCode: one K/V head shared by all query heads
    if cfg.get("multi_query_attention") and cfg.get("multi_query_group_num"):
        return int(cfg["multi_query_group_num"])  # ChatGLM
    for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv"):
        if isinstance(cfg.get(key), int):
            return int(cfg[key])
    return heads  # no key: plain multi-head attention


def _head_dim(cfg: dict[str, Any], heads: int, name: str) -> int:
    if cfg.get("head_dim") is not None:
        return _positive(cfg["head_dim"], "head_dim", name)
    hidden = _int(cfg, ("hidden_size", "n_embd", "d_model"), name)
    return hidden // heads


def _sliding_window(cfg: dict[str, Any]) -> int | None:
    if cfg.get("use_sliding_window") is False and "layer_types" not in cfg:
        return None  # Qwen2 ships a sliding_window value it does not use
    window = cfg.get("sliding_window")
    return window if isinstance(window, int) and window > 0 else None


def _layer_kinds(cfg: dict[str, Any], n_layers: int, window: int | None) -> tuple[LayerKind, ...]:
    kinds = _declared_kinds(cfg, n_layers) or _implied_kinds(cfg, n_layers, window)
    if len(kinds) != n_layers:
        msg = f"config describes {len(kinds)} layer kinds for {n_layers} layers"
        raise ModelConfigError(msg)
    if window is None:  # a sliding layer without a window keeps every token
        kinds = tuple(LayerKind.FULL if k is LayerKind.SLIDING else k for k in kinds)
    return kinds


def _declared_kinds(cfg: dict[str, Any], n_layers: int) -> tuple[LayerKind, ...]:
    """Layer kinds the config spells out, one entry per layer; empty when it does not."""
    if isinstance(cfg.get("hybrid_override_pattern"), str):  # NemotronH: M mamba, * attention
        symbols = {"M": LayerKind.STATE, "*": LayerKind.SLIDING}
        return tuple(symbols.get(c, LayerKind.NONE) for c in cfg["hybrid_override_pattern"])
    names = cfg.get("layer_types") or cfg.get("layers_block_type")
    if isinstance(names, list):
        unknown = sorted({str(n) for n in names} - set(_LAYER_TYPE_NAMES))
        if unknown:
            raise ModelConfigError(f"unsupported layer types in config: {', '.join(unknown)}")
        return tuple(_LAYER_TYPE_NAMES[n] for n in names)
    if "attn_layer_period" in cfg:  # Jamba
        period, offset = int(cfg["attn_layer_period"]), int(cfg.get("attn_layer_offset", 0))
        return tuple(_attn_or_state(i % period == offset) for i in range(n_layers))
    if "full_attention_interval" in cfg:  # Qwen3-Next
        interval = int(cfg["full_attention_interval"])
        return tuple(_attn_or_state((i + 1) % interval == 0) for i in range(n_layers))
    return ()


def _attn_or_state(is_attention: bool) -> LayerKind:
    return LayerKind.SLIDING if is_attention else LayerKind.STATE


def _implied_kinds(cfg: dict[str, Any], n_layers: int, window: int | None) -> tuple[LayerKind, ...]:
    """Layer kinds that follow from the model type's fixed pattern."""
    model_type = str(cfg.get("model_type", ""))
    if window is None:
        return (LayerKind.FULL,) * n_layers
    if model_type.startswith("qwen2") and "max_window_layers" in cfg:
        first = int(cfg["max_window_layers"])
        return tuple(LayerKind.SLIDING if i >= first else LayerKind.FULL for i in range(n_layers))
    if model_type == "gemma2":  # even layers slide, odd layers are global
        return tuple(LayerKind.FULL if i % 2 else LayerKind.SLIDING for i in range(n_layers))
    if model_type.startswith("gemma3"):  # every sliding_window_pattern-th layer is global
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return tuple(
            LayerKind.FULL if (i + 1) % pattern == 0 else LayerKind.SLIDING for i in range(n_layers)
        )
    return (LayerKind.SLIDING,) * n_layers  # Mistral: one window for every layer


def _state_elements_per_layer(cfg: dict[str, Any], name: str) -> int:
    """Elements of conv + recurrent state one mamba / linear-attention layer keeps per request."""

    def num(key: str, default: int | None = None) -> int:
        return _int(cfg if default is None else {key: default} | cfg, (key,), name)

    if cfg.get("mamba_num_heads"):  # Mamba-2 (NemotronH)
        inner, state = num("mamba_num_heads") * num("mamba_head_dim"), num("ssm_state_size")
        conv_dim = inner + 2 * num("n_groups", 1) * state
        return conv_dim * (num("conv_kernel", 4) - 1) + inner * state
    if cfg.get("mamba_d_state"):  # Mamba-1 (Jamba)
        inner = num("mamba_expand", 2) * num("hidden_size")
        return inner * (num("mamba_d_conv", 4) - 1) + inner * num("mamba_d_state")
    if cfg.get("linear_num_value_heads"):  # Gated DeltaNet (Qwen3-Next)
        key_dim, value_dim = num("linear_key_head_dim"), num("linear_value_head_dim")
        value_heads = num("linear_num_value_heads")
        conv_dim = 2 * num("linear_num_key_heads") * key_dim + value_heads * value_dim
        recurrent = value_heads * key_dim * value_dim
        return conv_dim * (num("linear_conv_kernel_dim", 4) - 1) + recurrent
    raise ModelConfigError(f"{name}: cannot size the state of its mamba/linear-attention layers")


def _dtype(cfg: dict[str, Any]) -> str | None:
    value = cfg.get("torch_dtype") or cfg.get("dtype")
    if not isinstance(value, str):
        return None
    value = value.removeprefix("torch.")
    return value if value in DTYPE_BYTES else None
