"""Tests for sidecar.core.plan.capacity: bytes per token and per request, pools and permits."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import ConfigError, PlanError
from sidecar.core.model.model_spec import load_model_spec, preset_names
from sidecar.core.plan.capacity import Budget, KvCost, MemoryInputs, Source, Term, make_plan
from sidecar.core.plan.config_json import LayerKind, ModelSpec, spec_from_config
from sidecar.core.plan.parallelism import valid_tp_sizes

CONFIGS = Path(__file__).parent / "configs"
GiB = 1024**3


def model(name: str) -> ModelSpec:
    """A preset, or a config from tests/configs."""
    path = CONFIGS / f"{name}.json"
    if path.exists():
        return spec_from_config(json.loads(path.read_text()), name)
    return load_model_spec(name)


def declared(name: str, n: int) -> Term:
    """A declared term of the formula."""
    return Term(name=name, bytes=n, source=Source.DECLARED)


def memory(vram: int, weights: int, overhead: int, neighbours: int = 0) -> MemoryInputs:
    """Declared GPU memory split."""
    return MemoryInputs(
        vram_total=declared("vram_total", vram),
        weights=declared("weights", weights),
        overhead=declared("overhead", overhead),
        neighbours=declared("neighbours", neighbours),
    )


@pytest.mark.parametrize(
    ("name", "kv_dtype", "tp", "per_gpu", "whole"),
    [
        # 2 x 28 layers x 4 heads x 128 x 2 B: the brief's worked example
        pytest.param("qwen2.5-7b", "fp16", 1, 57_344, 57_344, id="qwen2.5-7b-fp16"),
        pytest.param("llama-3.1-8b", "auto", 1, 131_072, 131_072, id="llama-3.1-8b-bf16"),
        pytest.param("llama-3.1-8b", "fp8_e4m3", 1, 65_536, 65_536, id="llama-fp8-one-byte"),
        pytest.param("llama-3.1-8b", "fp32", 1, 262_144, 262_144, id="llama-fp32"),
        pytest.param("llama-3.1-8b", "auto", 2, 65_536, 131_072, id="tp2-splits-heads"),
        # 8 KV heads over 16 GPUs: each GPU still holds one head, so the group holds 16
        pytest.param("llama-3.1-8b", "auto", 16, 16_384, 262_144, id="tp16-replicates-heads"),
        # 2 x 28 x 8 x 128 x 2: head_dim 128 though hidden/heads is 64
        pytest.param("qwen3-0.6b", "auto", 1, 114_688, 114_688, id="qwen3-explicit-head-dim"),
        pytest.param("mistral-small-3.1-24b", "auto", 1, 163_840, 163_840, id="text-config"),
        pytest.param("falcon-7b", "auto", 1, 8_192, 8_192, id="falcon-mqa"),
        pytest.param("gpt2", "auto", 1, 73_728, 73_728, id="gpt2-mha-fp32"),
        # MLA: 27 layers x (512 + 64) x 2 B, no factor 2, the same on every TP rank
        pytest.param("deepseek-v2-lite", "auto", 1, 31_104, 31_104, id="mla-v2-lite"),
        pytest.param("deepseek-v2-lite", "auto", 2, 31_104, 62_208, id="mla-replicated-tp2"),
        pytest.param("deepseek-v3", "auto", 8, 70_272, 562_176, id="mla-v3-tp8"),
        pytest.param("jamba-1.5-mini", "auto", 1, 16_384, 16_384, id="jamba-4-attention-layers"),
        pytest.param("nemotron-h-8b", "auto", 1, 16_384, 16_384, id="nemotron-h-4-attention"),
        pytest.param("qwen3-next-80b-a3b", "auto", 1, 24_576, 24_576, id="qwen3-next-12-full"),
        pytest.param("tiny-llama", "auto", 1, 1_024, 1_024, id="vllm-tiny-llama-fp32"),
        # the large presets: 2 x layers x KV heads x head_dim x 2 B (bf16)
        pytest.param("llama-3.1-70b", "auto", 1, 327_680, 327_680, id="llama-70b-80x8x128"),
        pytest.param("llama-3.1-70b", "auto", 8, 40_960, 327_680, id="llama-70b-tp8-one-head"),
        pytest.param("qwen2.5-72b", "auto", 4, 81_920, 327_680, id="qwen2.5-72b-tp4"),
        pytest.param("qwen3-32b", "auto", 1, 262_144, 262_144, id="qwen3-32b-64x8x128"),
        pytest.param("qwen3-30b-a3b", "auto", 1, 98_304, 98_304, id="qwen3-moe-48x4x128"),
        pytest.param("gpt-oss-20b", "auto", 1, 49_152, 49_152, id="gpt-oss-20b-24x8x64"),
        pytest.param("gpt-oss-120b", "auto", 1, 73_728, 73_728, id="gpt-oss-120b-36x8x64"),
        pytest.param("gpt-oss-120b", "fp8", 2, 18_432, 36_864, id="gpt-oss-120b-fp8-tp2"),
        pytest.param("mistral-small-3.1-24b", "auto", 2, 81_920, 163_840, id="mistral-small-tp2"),
    ],
)
def test_bytes_per_token(name: str, kv_dtype: str, tp: int, per_gpu: int, whole: int) -> None:
    """One token costs the hand-computed bytes on the fullest GPU and over the whole group."""
    cost = KvCost(spec=model(name), kv_dtype=kv_dtype, tp=tp)
    assert (cost.bytes_per_token_per_gpu, cost.bytes_per_token) == (per_gpu, whole)


@pytest.mark.parametrize(
    ("name", "block", "tokens", "expected"),
    [
        pytest.param("qwen2.5-7b", None, 4_000, 229_376_000, id="qwen-4000-tokens"),
        # 32 layers x 4096 B x min(8000, 4096): a Mistral layer never holds more than its window
        pytest.param("mistral-7b", None, 8_000, 536_870_912, id="mistral-window-caps"),
        pytest.param("mistral-7b", None, 1_000, 131_072_000, id="mistral-under-window"),
        # window of 4096 in blocks of 16 may straddle 257 blocks = 4112 slots
        pytest.param("mistral-7b", 16, 8_000, 32 * 4_096 * 4_112, id="mistral-window-blocks"),
        # 21 global layers x 8000 + 21 sliding x 4096, 8192 B per layer-token
        pytest.param("gemma-2-9b", None, 8_000, 254_016 * 8_192, id="gemma2-half-sliding"),
        # 12 full x 1000 + 12 sliding x 128, 2048 B per layer-token
        pytest.param("gpt-oss-20b", None, 1_000, 13_536 * 2_048, id="gpt-oss-layer-types"),
        pytest.param("jamba-1.5-mini", None, 4_000, 65_536_000 + 8_716_288, id="jamba-state"),
        pytest.param("nemotron-h-8b", None, 1_000, 16_384_000 + 51_806_208, id="nemotron-h-state"),
        pytest.param(
            "qwen3-next-80b-a3b", None, 1_000, 24_576_000 + 39_518_208, id="qwen3-next-state"
        ),
        # 1000 tokens take 8 blocks of 128 = 1024 slots
        pytest.param("tiny-llama", 128, 1_000, 1_048_576, id="tiny-llama-block-rounding"),
        pytest.param("tiny-llama", 128, 1_024, 1_048_576, id="tiny-llama-exact-blocks"),
        # 18 full x 1000 + 18 sliding x 128 slots, 2 x 8 x 64 x 2 = 2048 B per layer-token
        pytest.param("gpt-oss-120b", None, 1_000, 20_304 * 2_048, id="gpt-oss-120b-window-128"),
        # blocks of 16: a 128-token window may straddle 9 blocks = 144 slots; 1000 -> 1008
        pytest.param(
            "gpt-oss-120b", 16, 1_000, (18 * 1_008 + 18 * 144) * 2_048, id="gpt-oss-blocks"
        ),
        pytest.param("qwen3-30b-a3b", None, 4_000, 4_000 * 98_304, id="qwen3-moe-no-window"),
    ],
)
def test_request_bytes(name: str, block: int | None, tokens: int, expected: int) -> None:
    """One request's worst case honours windows, blocks and constant state."""
    assert KvCost(spec=model(name), block_size=block).request_bytes(tokens) == expected


# Every preset, and the configs that describe a model (llava's is refused on purpose elsewhere).
PRICED = [
    *preset_names(),
    *(p.stem for p in sorted(CONFIGS.glob("*.json")) if p.stem != "llava-1.5-7b"),
]


@given(
    name=st.sampled_from(PRICED),
    tokens=st.integers(min_value=1, max_value=300_000),
    block=st.one_of(st.none(), st.sampled_from([1, 16, 32, 128, 256])),
    data=st.data(),
)
def test_request_bytes_is_every_attention_layer_summed(
    name: str, tokens: int, block: int | None, data: st.DataObject
) -> None:
    """Priced per layer kind, a request costs what summing its slots layer by layer gives."""
    spec = model(name)
    tp = data.draw(st.sampled_from([t for t in valid_tp_sizes(spec) if t <= 16]), label="tp")
    cost = KvCost(spec=spec, block_size=block, tp=tp)
    per_layer = sum(
        cost.tokens_held(kind, tokens)
        for kind in cost.spec.layers
        if kind in (LayerKind.FULL, LayerKind.SLIDING)
    )
    expected = per_layer * cost.layer_bytes_per_token_per_gpu + cost.state_bytes_per_gpu
    assert cost.request_bytes(tokens) == expected * tp


def test_brief_worked_example_8gib_card() -> None:
    """VRAM 8 GiB, weights 5 GiB, overhead 1.5 GiB, 4000 tokens, alpha 0.8 gives N = 5."""
    cost = KvCost(spec=model("qwen2.5-7b"), kv_dtype="fp16")
    plan = make_plan(cost, memory(8 * GiB, 5 * GiB, 3 * GiB // 2), Budget(3_000, 1_000), 0.8)
    assert plan.kv_pool_bytes == 1_610_612_736
    assert plan.request_max_bytes == 229_376_000
    assert plan.permits == 5
    assert f"{float(plan.permits_exact):.2f}" == "5.62"


def test_agrees_with_vllm_cache_config_info() -> None:
    """The tiny model in a 1 GiB pool: 1,048,576 tokens and 1,024 requests, as vLLM 0.32 says."""
    cost = KvCost(spec=model("tiny-llama"), block_size=128)
    plan = make_plan(cost, declared("kv_pool_per_gpu", GiB), Budget(1_024, 0), 1.0)
    # vllm:cache_config_info{kv_cache_size_tokens="1048576",kv_cache_max_concurrency="1024.0",
    #                        num_gpu_blocks="8192",block_size="128"}
    assert (plan.kv_pool_tokens, plan.permits) == (1_048_576, 1_024)
    assert plan.kv_pool_tokens // 128 == 8_192


def test_tp_splits_weights_and_counts_the_group_pool() -> None:
    """With TP 2 each GPU holds half the weights; the group pool is twice one GPU's."""
    cost = KvCost(spec=model("llama-3.1-8b"), tp=2)
    plan = make_plan(cost, memory(24 * GiB, 16 * GiB, 2 * GiB), Budget(3_000, 1_000), 1.0)
    assert plan.kv_pool_bytes_per_gpu == 14 * GiB
    assert plan.kv_pool_bytes == 28 * GiB
    # 14 GiB / (4000 x 65,536 B) = 57.34
    assert plan.permits == 57


def test_neighbours_shrink_the_pool() -> None:
    """Memory other processes hold on the GPU is not ours to spend."""
    cost = KvCost(spec=model("qwen2.5-7b"))
    plan = make_plan(cost, memory(8 * GiB, 5 * GiB, GiB, GiB), Budget(3_000, 1_000), 1.0)
    assert plan.kv_pool_bytes == GiB
    assert [t.name for t in plan.terms][-1] == "kv_pool_per_gpu"


def test_plan_dict_carries_units_and_sources() -> None:
    """The JSON form has the required numbers and every term with its source."""
    cost = KvCost(spec=model("qwen2.5-7b"))
    plan = make_plan(cost, memory(8 * GiB, 5 * GiB, 3 * GiB // 2), Budget(3_000, 1_000), 0.8)
    out = json.loads(json.dumps(plan.to_dict()))
    assert out["kv_bytes_per_token"] == 57_344
    assert out["admissible_bytes"] == 1_288_490_188  # floor(0.8 x 1,610,612,736)
    assert {t["name"]: t["source"] for t in out["terms"]}["kv_pool_per_gpu"] == "derived"
    assert out["inputs"]["max_prompt_tokens"] == 3_000


@pytest.mark.parametrize(
    "alpha",
    [
        pytest.param(0.0, id="zero"),
        pytest.param(-0.5, id="negative"),
        pytest.param(1.01, id="above-one"),
        pytest.param(float("nan"), id="nan"),
    ],
)
def test_alpha_outside_unit_interval_is_refused(alpha: float) -> None:
    """alpha must lie in (0, 1]."""
    cost = KvCost(spec=model("qwen2.5-7b"))
    with pytest.raises(ConfigError, match="alpha"):
        make_plan(cost, declared("kv_pool_per_gpu", GiB), Budget(100, 0), alpha)


@pytest.mark.parametrize(
    ("prompt", "completion"),
    [
        pytest.param(0, 0, id="zero"),
        pytest.param(-1, 100, id="negative-prompt"),
        pytest.param(100, -1, id="negative-completion"),
    ],
)
def test_budget_must_be_positive(prompt: int, completion: int) -> None:
    """A request budget of no tokens, or negative ones, is refused."""
    with pytest.raises(ConfigError, match="token budget"):
        Budget(prompt, completion)


def test_no_room_for_kv_is_a_plan_error() -> None:
    """Weights + overhead filling the VRAM leaves no pool: PlanError with the numbers."""
    cost = KvCost(spec=model("qwen2.5-7b"))
    with pytest.raises(PlanError, match="no room for a KV cache"):
        make_plan(cost, memory(8 * GiB, 7 * GiB, GiB), Budget(100, 0), 0.8)


@pytest.mark.parametrize(
    ("kv_dtype", "tp", "block", "message"),
    [
        pytest.param("int3", 1, None, "unknown KV cache dtype", id="bad-dtype"),
        pytest.param("auto", 0, None, "tensor parallel", id="tp-zero"),
        pytest.param("auto", 1, 0, "block size", id="block-zero"),
    ],
)
def test_bad_cost_inputs(kv_dtype: str, tp: int, block: int | None, message: str) -> None:
    """Unknown dtypes and non-positive TP or block sizes are refused."""
    with pytest.raises(ConfigError, match=message):
        KvCost(spec=model("qwen2.5-7b"), kv_dtype=kv_dtype, tp=tp, block_size=block)


def test_auto_dtype_needs_a_model_dtype() -> None:
    """Without torch_dtype in the config, auto asks for --kv-dtype; an explicit one works."""
    spec = spec_from_config({"num_attention_heads": 2, "num_hidden_layers": 1, "head_dim": 8}, "x")
    with pytest.raises(ConfigError, match="--kv-dtype"):
        KvCost(spec=spec)
    assert KvCost(spec=spec, kv_dtype="bf16").bytes_per_token == 2 * 2 * 8 * 2


SPECS = st.sampled_from(
    ["qwen2.5-7b", "mistral-7b", "gemma-3-12b", "deepseek-v3", "jamba-1.5-mini"]
)
BLOCKS = st.sampled_from([None, 1, 16, 128])
POOLS = st.integers(min_value=1, max_value=200 * GiB)
TOKENS = st.integers(min_value=1, max_value=200_000)
ALPHAS = st.floats(min_value=0.01, max_value=1.0)


@given(SPECS, BLOCKS, POOLS, TOKENS, ALPHAS)
def test_permits_fit_in_alpha_of_the_pool(
    name: str, block: int | None, pool: int, tokens: int, alpha: float
) -> None:
    """permits x request bytes never exceeds alpha x pool, and permits are never negative."""
    cost = KvCost(spec=model(name), block_size=block)
    plan = make_plan(cost, declared("kv_pool_per_gpu", pool), Budget(tokens, 0), alpha)
    assert plan.permits >= 0
    assert plan.permits * plan.request_max_bytes <= plan.admissible_bytes


@given(name=SPECS, block=BLOCKS, pool=POOLS, extra=POOLS, tokens=TOKENS, alpha=ALPHAS)
def test_permits_never_fall_when_the_pool_grows(
    *, name: str, block: int | None, pool: int, extra: int, tokens: int, alpha: float
) -> None:
    """A bigger pool never gives fewer permits."""
    cost = KvCost(spec=model(name), block_size=block)
    small = make_plan(cost, declared("kv_pool_per_gpu", pool), Budget(tokens, 0), alpha)
    big = make_plan(cost, declared("kv_pool_per_gpu", pool + extra), Budget(tokens, 0), alpha)
    assert big.permits >= small.permits


@given(name=SPECS, block=BLOCKS, pool=POOLS, tokens=TOKENS, cut=TOKENS, alpha=ALPHAS)
def test_permits_never_fall_when_the_budget_shrinks(
    *, name: str, block: int | None, pool: int, tokens: int, cut: int, alpha: float
) -> None:
    """A smaller token budget never gives fewer permits."""
    cost = KvCost(spec=model(name), block_size=block)
    smaller = max(1, tokens - cut)
    full = make_plan(cost, declared("kv_pool_per_gpu", pool), Budget(tokens, 0), alpha)
    less = make_plan(cost, declared("kv_pool_per_gpu", pool), Budget(smaller, 0), alpha)
    assert less.permits >= full.permits


@pytest.mark.parametrize(
    ("name", "tp", "broken"),
    [
        # vllm/config/model.py verify_with_parallel_config: 32 % 3 != 0; and the KV rule
        # (vllm/model_executor/layers/linear.py QKVParallelLinear): 8 % 3 != 0, 3 % 8 != 0
        pytest.param("llama-3.1-8b", 3, ["attention heads", "KV heads"], id="llama-tp3-both"),
        # 28 % 7 == 0, but 4 KV heads neither split over 7 GPUs nor replicate evenly on them
        pytest.param("qwen2.5-7b", 7, ["KV heads"], id="qwen-tp7-kv-only"),
        pytest.param("qwen2.5-7b", 8, ["attention heads"], id="qwen-tp8-heads-only"),
        pytest.param("llama-3.1-8b", 16, [], id="llama-tp16-replicates-kv"),
        pytest.param("qwen2.5-7b", 28, [], id="qwen-tp28-replicates-kv-7x"),
        pytest.param("gpt-oss-120b", 8, [], id="gpt-oss-tp8"),
        pytest.param("deepseek-v3", 3, ["attention heads"], id="mla-tp3-heads"),
        pytest.param("deepseek-v3", 16, [], id="mla-tp16"),
    ],
)
def test_tensor_parallel_sizes_vllm_refuses(name: str, tp: int, broken: list[str]) -> None:
    """A TP size vLLM refuses is refused with each broken rule named; one it accepts prices."""
    if not broken:
        assert KvCost(spec=model(name), tp=tp).tp == tp
        return
    with pytest.raises(ConfigError) as refused:
        KvCost(spec=model(name), tp=tp)
    message = str(refused.value)
    assert message.startswith(f"vLLM refuses tensor parallel size {tp} for {name}: ")
    assert [rule for rule in ("attention heads", "KV heads") if rule in message] == broken


def test_mla_has_no_kv_heads_to_split() -> None:
    """MLA keeps one latent per layer: a KV-head count TP could not split does not matter."""
    preset = resources.files("sidecar.core.model") / "presets" / "deepseek-v3.json"
    cfg = json.loads(preset.read_text(encoding="utf-8"))
    spec = spec_from_config(cfg | {"num_key_value_heads": 6}, "deepseek-v3-kv6")
    assert KvCost(spec=spec, tp=8).bytes_per_token_per_gpu == 70_272


@pytest.mark.parametrize(
    ("name", "sizes"),
    [
        pytest.param("llama-3.1-8b", [1, 2, 4, 8, 16, 32], id="llama-32-heads-8-kv"),
        pytest.param("qwen2.5-7b", [1, 2, 4, 28], id="qwen-28-heads-4-kv"),
        pytest.param("qwen3-30b-a3b", [1, 2, 4, 8, 16, 32], id="qwen3-moe-32-heads-4-kv"),
        pytest.param("falcon-7b", [1, 71], id="falcon-71-heads-mqa"),
    ],
)
def test_valid_tp_sizes(name: str, sizes: list[int]) -> None:
    """The sizes the error offers are exactly those both of vLLM's rules accept."""
    assert valid_tp_sizes(model(name)) == sizes


def test_undeclared_neighbours_are_a_default() -> None:
    """Memory inputs that name no neighbours say so: 0 B by default, not a declared 0."""
    plan = make_plan(
        KvCost(spec=model("qwen2.5-7b")),
        MemoryInputs(
            vram_total=declared("vram_total", 8 * GiB),
            weights=declared("weights", 5 * GiB),
            overhead=declared("overhead", GiB),
        ),
        Budget(3_000, 1_000),
        0.8,
    )
    neighbours = next(t for t in plan.terms if t.name == "neighbours")
    assert (neighbours.bytes, neighbours.source) == (0, Source.DEFAULT)
