"""Tests for sidecar.core.model_spec: reading KV-cache shapes from real-shaped config.json files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.errors import ModelConfigError
from sidecar.core.model_spec import (
    LayerKind,
    ModelSpec,
    load_model_spec,
    preset_names,
    spec_from_config,
    weights_bytes_in,
)

CONFIGS = Path(__file__).parent / "configs"
FULL, SLIDING, STATE, NONE = LayerKind.FULL, LayerKind.SLIDING, LayerKind.STATE, LayerKind.NONE


def config(name: str) -> dict[str, Any]:
    """A hand-written config from tests/configs."""
    loaded: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


def spec(name: str, **overrides: Any) -> ModelSpec:
    """The spec of a tests/configs config, with some keys replaced."""
    return spec_from_config(config(name) | overrides, name)


@pytest.mark.parametrize(
    ("name", "kv_heads", "head_dim"),
    [
        pytest.param("qwen3-0.6b", 8, 128, id="explicit-head-dim-not-hidden-over-heads"),
        pytest.param("mistral-small-3.1-24b", 8, 128, id="text-config"),
        pytest.param("falcon-7b", 1, 64, id="falcon-multi-query"),
        pytest.param("gpt2", 12, 64, id="no-kv-key-is-mha"),
        pytest.param("tiny-llama", 2, 32, id="vllm-tiny-llama"),
    ],
)
def test_heads_and_head_dim(name: str, kv_heads: int, head_dim: int) -> None:
    """KV heads and head_dim come from whichever keys the model family uses."""
    got = spec(name)
    assert (got.num_kv_heads, got.head_dim) == (kv_heads, head_dim)


def test_falcon_new_decoder_reads_num_kv_heads() -> None:
    """Falcon-40B style configs keep several KV heads under num_kv_heads."""
    got = spec("falcon-7b", new_decoder_architecture=True, num_kv_heads=8)
    assert got.num_kv_heads == 8


def test_text_config_takes_dtype_from_the_top() -> None:
    """A multimodal config's decoder inherits the top-level torch_dtype."""
    got = spec("mistral-small-3.1-24b")
    assert (got.dtype, got.attention_layers, got.model_type) == ("bfloat16", 40, "mistral")


def test_mla_latent_is_rank_plus_rope_dim() -> None:
    """DeepSeek MLA caches kv_lora_rank + qk_rope_head_dim per layer."""
    assert spec("deepseek-v2-lite").mla_latent_dim == 512 + 64


@pytest.mark.parametrize(
    ("name", "overrides", "layers", "window"),
    [
        pytest.param("gpt-oss-20b", {}, (SLIDING, FULL) * 12, 128, id="layer-types-interleaved"),
        pytest.param(
            "qwen3-0.6b", {"sliding_window": 4096}, (FULL,) * 28, None, id="layer-types-all-full"
        ),
        pytest.param("tiny-llama", {"sliding_window": 64}, (SLIDING,) * 2, 64, id="global-window"),
        pytest.param(
            "tiny-llama",
            {"sliding_window": 64, "use_sliding_window": False},
            (FULL,) * 2,
            None,
            id="qwen2-window-switched-off",
        ),
        pytest.param(
            "tiny-llama",
            {"model_type": "qwen2", "sliding_window": 64, "max_window_layers": 1},
            (FULL, SLIDING),
            64,
            id="qwen2-max-window-layers",
        ),
        pytest.param(
            "gpt-oss-20b",
            {"layer_types": None, "model_type": "gemma2", "num_hidden_layers": 4},
            (SLIDING, FULL, SLIDING, FULL),
            128,
            id="gemma2-alternates",
        ),
        pytest.param(
            "gpt-oss-20b",
            {"layer_types": None, "model_type": "gemma3_text", "num_hidden_layers": 7},
            (SLIDING,) * 5 + (FULL, SLIDING),
            128,
            id="gemma3-every-sixth-global",
        ),
    ],
)
def test_sliding_windows(
    name: str, overrides: dict[str, Any], layers: tuple[LayerKind, ...], window: int | None
) -> None:
    """Each layer is sliding or full as the config (or its model family) says."""
    got = spec(name, **overrides)
    assert (got.layers, got.sliding_window) == (layers, window)


@pytest.mark.parametrize(
    ("name", "attention", "state_layers", "state_bytes"),
    [
        # 24 Mamba-2 layers: (8192 + 2*8*128) x 3 conv + 128*64*128 ssm = 1,079,296 x 2 B each
        pytest.param("nemotron-h-8b", 4, 24, 24 * 1_079_296 * 2, id="nemotron-h-pattern"),
        # 36 Gated-DeltaNet layers: 8192 x 3 conv + 32*128*128 recurrent = 548,864 x 2 B each
        pytest.param("qwen3-next-80b-a3b", 12, 36, 36 * 548_864 * 2, id="qwen3-next-linear"),
    ],
)
def test_hybrid_layers(name: str, attention: int, state_layers: int, state_bytes: int) -> None:
    """Only attention layers grow with tokens; the others carry a fixed state per request."""
    got = spec(name)
    assert got.attention_layers == attention
    assert got.layers.count(STATE) == state_layers
    assert got.state_bytes_per_request == state_bytes


def test_nemotron_mlp_layers_keep_nothing() -> None:
    """NemotronH '-' layers are MLPs with no cache at all."""
    assert spec("nemotron-h-8b").layers.count(NONE) == 24


def test_jamba_period_and_offset() -> None:
    """Jamba puts attention at every attn_layer_period-th layer from attn_layer_offset."""
    got = load_model_spec("jamba-1.5-mini")
    assert [i for i, kind in enumerate(got.layers) if kind is FULL] == [4, 12, 20, 28]
    # 28 Mamba-1 layers: d_inner 8192 x (3 conv + 16 state) elements x 2 B
    assert got.state_bytes_per_request == 28 * 8192 * 19 * 2


def test_layers_block_type_list() -> None:
    """A layers_block_type list marks mamba and attention layers by name."""
    got = spec("tiny-llama", layers_block_type=["mamba", "attention"], mamba_d_state=16)
    assert got.layers == (STATE, FULL)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param({"num_hidden_layers": None}, "none of num_hidden_layers", id="no-layers"),
        pytest.param({"head_dim": 0}, "head_dim must be a positive", id="zero-head-dim"),
        pytest.param({"layer_types": ["full_attention"]}, "1 layer kinds for 2", id="short-list"),
        pytest.param({"layer_types": ["moe", "moe"]}, "unsupported layer types", id="bad-kind"),
        pytest.param(
            {"layer_types": ["mamba", "full_attention"]}, "cannot size the state", id="no-dims"
        ),
    ],
)
def test_invalid_configs_name_the_problem(overrides: dict[str, Any], message: str) -> None:
    """Configs we cannot size raise ModelConfigError saying why."""
    with pytest.raises(ModelConfigError, match=message):
        spec("tiny-llama", **overrides)


def test_text_config_without_decoder_sizes_is_rejected() -> None:
    """A Llava config that leaves the decoder's sizes to defaults is refused clearly."""
    with pytest.raises(ModelConfigError, match="none of num_attention_heads"):
        spec("llava-1.5-7b")


def test_missing_dtype_is_none() -> None:
    """A config without torch_dtype leaves the dtype unknown rather than guessing."""
    assert spec("tiny-llama", dtype=None).dtype is None


def test_load_from_file_dir_and_preset(tmp_path: Path) -> None:
    """A config.json path, its directory and a preset name all load."""
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((CONFIGS / "tiny-llama.json").read_text())
    assert load_model_spec(str(model_dir)).name == "my-model"
    assert load_model_spec(str(model_dir / "config.json")).num_kv_heads == 2
    assert load_model_spec("qwen2.5-7b").attention_layers == 28


def test_presets_all_load() -> None:
    """Every shipped preset parses, and the required families are there."""
    names = preset_names()
    assert {"qwen2.5-7b", "llama-3.1-8b", "mistral-7b", "deepseek-v3", "jamba-1.5-mini"} <= set(
        names
    )
    assert all(load_model_spec(name).attention_layers > 0 for name in names)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("{not json", "not valid JSON", id="bad-json"),
        pytest.param("[1, 2]", "not a JSON object", id="not-object"),
    ],
)
def test_load_rejects_bad_files(tmp_path: Path, content: str, message: str) -> None:
    """Broken config files raise ModelConfigError, not a JSON traceback."""
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ModelConfigError, match=message):
        load_model_spec(str(path))


def test_load_unknown_reference_lists_presets(tmp_path: Path) -> None:
    """Neither a file nor a preset: the error lists the presets."""
    with pytest.raises(ModelConfigError, match=r"presets: .*qwen2\.5-7b"):
        load_model_spec(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelConfigError, match="cannot read"):
        load_model_spec(str(tmp_path / "empty"))


def test_weights_prefer_safetensors(tmp_path: Path) -> None:
    """Weights sum the safetensors shards and ignore duplicate .bin copies."""
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 300)
    (tmp_path / "model-00002.safetensors").write_bytes(b"x" * 200)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x" * 999)
    (tmp_path / "config.json").write_text("{}")
    assert weights_bytes_in(tmp_path) == 500


def test_weights_fall_back_to_gguf_and_fail_when_none(tmp_path: Path) -> None:
    """A gguf-only directory counts its file; a directory without weights is an error."""
    (tmp_path / "model.gguf").write_bytes(b"x" * 42)
    assert weights_bytes_in(tmp_path) == 42
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelConfigError, match="no weight files"):
        weights_bytes_in(empty)


@pytest.mark.parametrize(
    ("ref", "preset"),
    [
        pytest.param("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b", id="qwen-instruct"),
        pytest.param("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b", id="meta-llama"),
        pytest.param("mistralai/Mistral-7B-v0.1", "mistral-7b", id="mistral-v0.1"),
        pytest.param("google/gemma-2-9b-it", "gemma-2-9b", id="gemma-it"),
        pytest.param("ai21labs/AI21-Jamba-1.5-Mini", "jamba-1.5-mini", id="jamba"),
    ],
)
def test_hub_ids_find_their_preset(ref: str, preset: str) -> None:
    """Hugging Face ids of tuned variants find the base model's preset."""
    assert load_model_spec(ref).name == preset


def test_other_versions_do_not_borrow_a_preset() -> None:
    """Mistral v0.3 (no sliding window) must not silently use the v0.1 preset."""
    with pytest.raises(ModelConfigError, match="no preset"):
        load_model_spec("mistralai/Mistral-7B-Instruct-v0.3")
