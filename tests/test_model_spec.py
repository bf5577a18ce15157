"""Tests for sidecar.core.plan.config_json and model_spec: KV-cache shapes from real-shaped
config.json files, and finding a model's config and weights (path, directory, Hugging Face cache,
preset)."""

from __future__ import annotations

import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.errors import ModelConfigError
from sidecar.core.model.hub_cache import hub_cache_dir
from sidecar.core.model.model_spec import (
    SAFETENSORS_INDEX,
    load_model,
    load_model_spec,
    preset_names,
    weights_bytes_in,
)
from sidecar.core.plan.capacity import Source, Term
from sidecar.core.plan.config_json import LayerKind, ModelSpec, spec_from_config

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


# Each preset's weight bytes, with where the figure was published. The Hub's safetensors index
# gives "metadata": {"total_size": N}; where it could not be found, parameters x 2 B (bfloat16).
PRESET_WEIGHTS = [
    pytest.param("deepseek-v3", 688_586_727_753, "index.json total_size", id="deepseek-v3-index"),
    pytest.param("gemma-2-9b", 18_483_411_968, "index.json total_size", id="gemma-2-9b-index"),
    # the Hub counts 12,187,325,040 safetensors parameters for google/gemma-3-12b-it
    pytest.param(
        "gemma-3-12b", 24_374_650_080, "estimated from 12,187,325,040", id="gemma-3-12b-params"
    ),
    pytest.param("gpt-oss-20b", 13_761_264_768, "openai/gpt-oss-20b", id="gpt-oss-20b-index"),
    pytest.param("gpt-oss-120b", 65_248_815_744, "openai/gpt-oss-120b", id="gpt-oss-120b-index"),
    pytest.param("jamba-1.5-mini", 103_140_646_656, "index.json", id="jamba-mini-index"),
    pytest.param("llama-3.1-8b", 16_060_522_496, "index.json", id="llama-8b-index"),
    # 70,553,706,496 parameters x 2 B: 80 x (Q,K,V,O + 3 x 8192 x 28672 + norms) + 2 x embeddings
    pytest.param("llama-3.1-70b", 141_107_412_992, "Llama-3.1-70B", id="llama-70b-index"),
    pytest.param("mistral-7b", 14_483_464_192, "index.json", id="mistral-7b-index"),
    pytest.param(
        "mistral-small-3.1-24b",
        48_022_722_560,
        "estimated from 24,011,361,280 parameters x 2 B",
        id="mistral-small-params",
    ),
    pytest.param("qwen2.5-7b", 15_231_233_024, "index.json", id="qwen2.5-7b-index"),
    pytest.param("qwen2.5-72b", 145_412_407_296, "Qwen2.5-72B", id="qwen2.5-72b-index"),
    pytest.param("qwen3-8b", 16_381_470_720, "index.json", id="qwen3-8b-index"),
    pytest.param("qwen3-32b", 65_524_246_528, "Qwen3-32B", id="qwen3-32b-index"),
    pytest.param("qwen3-30b-a3b", 61_064_245_248, "Qwen3-30B-A3B", id="qwen3-30b-a3b-index"),
]


@pytest.mark.parametrize(("name", "size", "said"), PRESET_WEIGHTS)
def test_presets_carry_their_weight_bytes(name: str, size: int, said: str) -> None:
    """A preset knows its weights and says where the figure came from."""
    weights = load_model(name).weights
    assert weights is not None
    assert (weights.bytes, weights.source) == (size, Source.PRESET)
    assert weights.detail is not None
    assert said in weights.detail


def test_every_preset_has_a_weight_figure() -> None:
    """A preset added without its weights would make `--model NAME --vram X` ask for them."""
    assert sorted(str(p.values[0]) for p in PRESET_WEIGHTS) == preset_names()


@pytest.mark.parametrize(
    ("name", "layers", "experts"),
    [
        pytest.param("gpt-oss-20b", 24, 32, id="gpt-oss-20b"),
        pytest.param("gpt-oss-120b", 36, 128, id="gpt-oss-120b"),
    ],
)
def test_gpt_oss_presets_alternate_windowed_and_full_layers(
    name: str, layers: int, experts: int
) -> None:
    """gpt-oss: sliding (128) then full attention, 8 KV heads of 64; no dtype in its config.json,
    so the preset says bfloat16 as vLLM reads it from the safetensors."""
    raw = json.loads(
        (resources.files("sidecar.core.model") / "presets" / f"{name}.json").read_text()
    )
    assert "torch_dtype" not in raw
    assert (raw["num_local_experts"], raw["quantization_config"]["quant_method"]) == (
        experts,
        "mxfp4",
    )
    got = load_model(name).spec
    assert got.layers == (SLIDING, FULL) * (layers // 2)
    assert (got.sliding_window, got.num_kv_heads, got.head_dim) == (128, 8, 64)
    assert (got.num_attention_heads, got.dtype) == (64, "bfloat16")


def _blob(cache: Path, repo: str, text: str | bytes) -> Path:
    """Store content as the Hub cache does, under blobs/, named for its hash."""
    data = text.encode() if isinstance(text, str) else text
    blob = cache / repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    return blob


def fake_hub_cache(
    cache: Path, hub_id: str, files: dict[str, str | bytes], *, commit: str = "a" * 40
) -> Path:
    """A model in the real cache layout: refs/main names the commit, snapshots/<commit>/ links
    each file to its blob. Returns the snapshot directory."""
    repo = "models--" + hub_id.replace("/", "--")
    snapshot = cache / repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (snapshot / name).symlink_to(os.path.relpath(_blob(cache, repo, content), snapshot))
    refs = cache / repo / "refs"
    refs.mkdir(exist_ok=True)
    (refs / "main").write_text(commit)
    return snapshot


TINY = (CONFIGS / "tiny-llama.json").read_text()
INDEX = json.dumps({"metadata": {"total_size": 1_234_567}, "weight_map": {}})


def test_hub_id_found_in_the_local_cache(tmp_path: Path) -> None:
    """An id in the cache loads the cached config and measures the weights from its index,
    ahead of the preset the same id answers to."""
    fake_hub_cache(
        tmp_path,
        "Qwen/Qwen2.5-7B-Instruct",
        {
            "config.json": TINY,
            SAFETENSORS_INDEX: INDEX,
            "model-00001-of-00001.safetensors": b"\0" * 100,
        },
    )
    got = load_model("Qwen/Qwen2.5-7B-Instruct", tmp_path)
    assert (got.spec.name, got.spec.num_kv_heads, got.spec.attention_layers) == (
        "Qwen/Qwen2.5-7B-Instruct",
        2,
        2,
    )
    assert got.weights == Term(
        name="weights",
        bytes=1_234_567,
        source=Source.MEASURED,
        observed_at=None,
        detail=f"{SAFETENSORS_INDEX} total_size in {tmp_path}/models--Qwen--Qwen2.5-7B-Instruct/"
        f"snapshots/{'a' * 40}",
    )
    assert got.found.startswith("local Hugging Face cache: ")


@pytest.mark.parametrize(
    ("files", "size", "said"),
    [
        pytest.param(
            {
                "model-00001-of-00002.safetensors": b"x" * 300,
                "model-00002-of-00002.safetensors": b"y" * 200,
            },
            500,
            "2 *.safetensors files",
            id="shards-summed-through-blob-links",
        ),
        pytest.param(
            {SAFETENSORS_INDEX: INDEX, "consolidated.safetensors": b"z" * 999},
            1_234_567,
            "total_size",
            id="index-ignores-consolidated-copy",
        ),
        pytest.param({"model.gguf": b"g" * 42}, 42, "1 *.gguf files", id="gguf"),
    ],
)
def test_cached_weights_are_measured(
    tmp_path: Path, files: dict[str, bytes], size: int, said: str
) -> None:
    """Weights come from the index's total_size, else the weight files' real (blob) sizes."""
    fake_hub_cache(tmp_path, "org/model", {"config.json": TINY, **files})
    weights = load_model("org/model", tmp_path).weights
    assert weights is not None
    assert (weights.bytes, weights.source) == (size, Source.MEASURED)
    assert weights.detail is not None
    assert said in weights.detail


def test_cache_lookup_ignores_letter_case(tmp_path: Path) -> None:
    """The Hub does not tell ids apart by case; neither does the lookup."""
    fake_hub_cache(tmp_path, "Org/Model-7B", {"config.json": TINY})
    assert load_model("org/model-7b", tmp_path).spec.num_kv_heads == 2


def test_cache_without_refs_main_uses_its_only_snapshot(tmp_path: Path) -> None:
    """Fetched by commit, a model has no refs/main; its one snapshot is the model."""
    snapshot = fake_hub_cache(tmp_path, "org/model", {"config.json": TINY})
    (snapshot.parent.parent / "refs" / "main").unlink()
    assert load_model("org/model", tmp_path).directory == snapshot
    fake_hub_cache(tmp_path, "org/model", {"config.json": TINY}, commit="b" * 40)
    (snapshot.parent.parent / "refs" / "main").unlink()
    with pytest.raises(ModelConfigError, match="several snapshots"):
        load_model("org/model", tmp_path)


@pytest.mark.parametrize(
    ("ref", "found"),
    [
        pytest.param("Qwen/Qwen2.5-7B-Instruct", "preset qwen2.5-7b", id="uncached-id-preset"),
        pytest.param("qwen2.5-7b", "preset qwen2.5-7b", id="preset-name"),
    ],
)
def test_uncached_ids_fall_back_to_presets(tmp_path: Path, ref: str, found: str) -> None:
    """Not in the cache (or not an id at all): the presets answer, as before."""
    fake_hub_cache(tmp_path, "other/model", {"config.json": TINY})
    assert load_model(ref, tmp_path).found == found


def test_broken_index_is_named(tmp_path: Path) -> None:
    """An index without a usable total_size is an error, not a silent guess."""
    fake_hub_cache(
        tmp_path, "org/model", {"config.json": TINY, SAFETENSORS_INDEX: '{"metadata": {}}'}
    )
    with pytest.raises(ModelConfigError, match=r"no positive metadata\.total_size"):
        load_model("org/model", tmp_path)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            {"HF_HUB_CACHE": "/a", "HUGGINGFACE_HUB_CACHE": "/b", "HF_HOME": "/c"},
            "/a",
            id="hf-hub-cache-first",
        ),
        pytest.param({"HUGGINGFACE_HUB_CACHE": "/b", "HF_HOME": "/c"}, "/b", id="legacy-hub-cache"),
        pytest.param({"HF_HOME": "/c", "XDG_CACHE_HOME": "/x"}, "/c/hub", id="hf-home"),
        pytest.param({"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/huggingface/hub", id="xdg"),
        pytest.param({"HOME": "/h"}, "/h/.cache/huggingface/hub", id="home"),
    ],
)
def test_hub_cache_dir_follows_huggingface_hub(env: dict[str, str], expected: str) -> None:
    """The same variables, in the same order, as huggingface_hub's constants."""
    assert hub_cache_dir(env) == Path(expected)


def safetensors(**tensors: str) -> bytes:
    """A real safetensors file: 8 bytes of header length, the JSON header, then the data
    (one element of each tensor, of its dtype's size)."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": [1],
            "data_offsets": [offset, offset + sizes[dtype]],
        }
        offset += sizes[dtype]
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + b"\0" * offset


NO_DTYPE = json.dumps({k: v for k, v in config("tiny-llama").items() if "dtype" not in k})


@pytest.mark.parametrize(
    ("tensors", "dtype"),
    [
        # gpt-oss: attention and router in BF16, MoE experts as U8 MXFP4 blocks and scales
        pytest.param({"attn": "BF16", "blocks": "U8", "scales": "U8"}, "bfloat16", id="gpt-oss"),
        pytest.param({"w": "F8_E4M3", "scale": "BF16"}, "bfloat16", id="fp8-with-bf16"),
        pytest.param({"a": "F16", "b": "BF16"}, "float32", id="mixed-floats-promote"),
        pytest.param({"a": "U8"}, None, id="no-floats"),
    ],
)
def test_config_without_dtype_takes_the_weights_dtype(
    tmp_path: Path, tensors: dict[str, str], dtype: str | None
) -> None:
    """A config.json naming no dtype (as gpt-oss's) gets the one its safetensors hold, as vLLM's
    _find_dtype reads it."""
    fake_hub_cache(
        tmp_path,
        "openai/gpt-oss-20b",
        {"config.json": NO_DTYPE, "model-00000-of-00001.safetensors": safetensors(**tensors)},
    )
    assert load_model("openai/gpt-oss-20b", tmp_path).spec.dtype == dtype


def test_not_a_safetensors_file_is_named(tmp_path: Path) -> None:
    """A weight file whose header length is nonsense is reported, not read as a dtype."""
    fake_hub_cache(tmp_path, "org/model", {"config.json": NO_DTYPE, "x.safetensors": b"\xff" * 16})
    with pytest.raises(ModelConfigError, match="is not a safetensors file"):
        load_model("org/model", tmp_path)
