"""The overhead estimate: model widths from config.json, vLLM's profiling run priced from them,
vLLM's serve defaults by GPU, and pipeline stages split as vLLM splits them."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.errors import ConfigError
from sidecar.core.plan.capacity import KvCost, Source
from sidecar.core.plan.config_json import spec_from_config
from sidecar.core.plan.engine_overhead import (
    EngineSettings,
    activation_peak,
    overhead_parts,
    overhead_total,
)
from sidecar.core.plan.gpu_presets import GIB, GPUS, ServeDefaults, vllm_serve_defaults
from sidecar.core.plan.model_shape import ModelShape, shape_from_config
from sidecar.core.plan.parallelism import last_stage_is_fullest, pipeline_stages

CONFIGS = Path(__file__).parent / "configs"


def config(name: str) -> dict[str, Any]:
    """A preset's or a test config's parsed config.json."""
    preset = resources.files("sidecar.core.model") / "presets" / f"{name}.json"
    text = preset.read_text("utf-8") if preset.is_file() else (CONFIGS / f"{name}.json").read_text()
    cfg: dict[str, Any] = json.loads(text)
    return cfg


def shape(name: str) -> ModelShape:
    """A model's shape; the test fails if its config does not tell one."""
    found = shape_from_config(config(name))
    assert found is not None
    return found


@pytest.mark.parametrize(
    ("name", "tp", "mlp", "per_token"),
    [
        # dense: 3 x 14,336 = 43,008; 2 x (3 x 4,096 + 43,008) = 110,592
        pytest.param("llama-3.1-8b", 1, 43_008, 110_592, id="dense-llama-8b"),
        # TP 2 halves the MLP, not the hidden-wide tensors: 3 x 7,168 = 21,504
        pytest.param("llama-3.1-8b", 2, 21_504, 67_584, id="dense-tp2"),
        # experts only (no dense layer): 8 x (3 x 768 + 2,048) = 34,816; 2 x (6,144 + 34,816)
        pytest.param("qwen3-30b-a3b", 1, 34_816, 81_920, id="moe-qwen3-30b"),
        # 8 x (3 x 192 + 2,048) = 20,992; 2 x (6,144 + 20,992) = 54,272
        pytest.param("qwen3-30b-a3b", 4, 20_992, 54_272, id="moe-tp4"),
        # gpt-oss names its expert width intermediate_size: 4 x (3 x 2,880 + 2,880) = 46,080
        pytest.param("gpt-oss-120b", 1, 46_080, 109_440, id="moe-width-in-intermediate-size"),
        # first layer dense (3 x 5,472 = 16,416) under the experts' 6 x (3 x 704 + 2,048)
        pytest.param("deepseek-v2-lite", 2, 24_960, 62_208, id="mla-moe-dense-first-tp2"),
    ],
)
def test_forward_bytes_per_token(name: str, tp: int, mlp: int, per_token: int) -> None:
    """One batched token's peak on one GPU: three hidden-wide tensors beside the widest MLP."""
    assert shape(name).mlp_width(tp) == mlp
    assert shape(name).forward_bytes_per_token(tp) == per_token


def test_the_forward_slope_is_vllms() -> None:
    """vLLM's torch peak for Llama-3.1-8B grew 17.98 - 17.06 = 0.92 GiB from 20,000 to 29,000
    batched tokens (vllm#10517): 109,760 B a token; the estimate's 110,592 B is within 1 %."""
    measured = (17.98 - 17.06) * 1024**3 / 9000
    assert abs(shape("llama-3.1-8b").forward_bytes_per_token(1) / measured - 1) < 0.01


def test_a_config_without_widths_gives_no_shape() -> None:
    """GPT-2 names its widths n_embd/n_inner: no estimate, a stated default stands in."""
    assert shape_from_config(config("gpt2")) is None


def test_the_larger_of_forward_and_sampler_is_the_peak() -> None:
    """Llama-3.1-8B at 8,192 tokens and 256 sequences: the forward's 8,192 x 110,592 B is under
    the sampler's 256 x 128,256 x 32 B beside the kept 8,192 x 4,096 x 2 B output."""
    settings = EngineSettings(max_num_batched_tokens=8192, max_num_seqs=256)
    parts = {t.name: t for t in overhead_parts(shape("llama-3.1-8b"), settings)}
    sampler = 256 * 128_256 * 32 + 8192 * 4096 * 2
    assert sampler > 8192 * 110_592
    assert parts["activation_peak"].bytes == sampler
    assert parts["non_torch"].bytes == 256 * 1024**2
    assert parts["cuda_graphs"].bytes == 256 * 110_592  # min(512, 256 sequences)
    assert {t.source for t in parts.values()} == {Source.ESTIMATED}


def test_long_batches_peak_in_the_forward() -> None:
    """At 20,000 batched tokens the forward wins: 20,000 x 110,592 B = 2.06 GiB, vLLM's logged
    peak was 2.07 GiB (vllm#10517)."""
    settings = EngineSettings(max_num_batched_tokens=20000, max_num_seqs=256)
    assert activation_peak(shape("llama-3.1-8b"), settings).bytes == 20000 * 110_592


def test_a_stage_before_the_last_runs_no_sampler() -> None:
    """Pipeline stages before the last never sample: their peak is the forward's."""
    settings = EngineSettings(max_num_batched_tokens=2048, max_num_seqs=256, sampler=False)
    # 6 x (3 x 1,408 + 2,048) = 37,632 over the dense 3 x 10,944; 2 x (6,144 + 37,632) = 87,552
    assert activation_peak(shape("deepseek-v2-lite"), settings).bytes == 2048 * 87_552


@pytest.mark.parametrize(
    ("name", "pp", "samples"),
    [
        pytest.param("deepseek-v2-lite", 2, False, id="27-layers-14-then-13"),
        pytest.param("llama-3.1-8b", 2, True, id="32-layers-16-and-16"),
        pytest.param("llama-3.1-8b", 1, True, id="one-stage"),
    ],
)
def test_the_sampling_stage_is_priced_when_it_is_the_fullest(
    name: str, pp: int, samples: bool
) -> None:
    """The last stage samples; it binds the pool when it holds as many layers as any stage."""
    layers = spec_from_config(config(name), name).layers
    assert last_stage_is_fullest(layers, pp) is samples


def test_enforce_eager_captures_no_graphs() -> None:
    """--enforce-eager: the graph term is a declared 0; the total is still an estimate."""
    settings = EngineSettings(max_num_batched_tokens=2048, max_num_seqs=256, cuda_graphs=False)
    parts = overhead_parts(shape("llama-3.1-8b"), settings)
    graphs = parts[-1]
    assert (graphs.name, graphs.bytes, graphs.source) == ("cuda_graphs", 0, Source.DECLARED)
    total = overhead_total(parts)
    assert total.bytes == sum(t.bytes for t in parts)
    assert total.source is Source.ESTIMATED


def test_settings_below_one_are_refused() -> None:
    """A zero batch cannot be profiled."""
    with pytest.raises(ConfigError, match="max_num_seqs must be at least 1"):
        EngineSettings(max_num_batched_tokens=2048, max_num_seqs=0)


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        pytest.param("h100-80gb", ServeDefaults(8192, 1024), id="h100"),
        pytest.param("h200", ServeDefaults(8192, 1024), id="h200-under-160gib"),
        pytest.param("a100-80gb", ServeDefaults(2048, 256), id="a100-keeps-small-defaults"),
        pytest.param("l4", ServeDefaults(2048, 256), id="l4"),
    ],
)
def test_vllm_serve_defaults_by_gpu(gpu: str, expected: ServeDefaults) -> None:
    """vLLM 0.32's get_batch_defaults: by memory, A100s excepted."""
    assert vllm_serve_defaults(GPUS[gpu].total_bytes, GPUS[gpu]) == expected


def test_the_largest_gpus_get_the_largest_defaults() -> None:
    """160 GiB and more: 16,384 tokens and 1,024 sequences."""
    assert vllm_serve_defaults(180 * GIB) == ServeDefaults(16384, 1024)


def test_presets_are_the_memory_cuda_reports() -> None:
    """An "80GB" H100 shows 79.22 GiB; the 24 GB consumer cards about 23.6 GiB."""
    assert GPUS["h100-80gb"].total_bytes == 7922 * GIB // 100
    assert GPUS["rtx-3090"].total_bytes == 2358 * GIB // 100
    assert all(preset.seen for preset in GPUS.values())


@pytest.mark.parametrize(
    ("layers", "pp", "stages"),
    [
        pytest.param(27, 2, [14, 13], id="deepseek-v2-lite"),
        pytest.param(32, 4, [8, 8, 8, 8], id="even"),
        pytest.param(10, 4, [2, 3, 3, 2], id="remainder-before-the-last"),
    ],
)
def test_pipeline_stages_split_as_vllm_does(layers: int, pp: int, stages: list[int]) -> None:
    """get_pp_indices: an even share, the remainder to the stages before the last."""
    assert pipeline_stages(layers, pp) == stages


def test_pipeline_prices_the_fullest_stage() -> None:
    """DeepSeek-V2-Lite at TP 2 x PP 2: a GPU of the first stage holds 14 of 27 latents."""
    cost = KvCost(spec=spec_from_config(config("deepseek-v2-lite"), "dsv2-lite"), tp=2, pp=2)
    assert cost.bytes_per_token_per_gpu == 14 * 576 * 2
    assert cost.bytes_per_token == 27 * 576 * 2 * 2


def test_more_stages_than_layers_are_refused() -> None:
    """vLLM cannot give a stage no layer."""
    with pytest.raises(ConfigError, match="pipeline parallel size must be 1 to 27"):
        pipeline_stages(27, 28)
