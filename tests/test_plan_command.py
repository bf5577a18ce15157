"""Tests for `sidecar plan`: the derivation, --json, and one clear line for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.entry.cli import main

CONFIGS = Path(__file__).parent / "configs"
QWEN_8GIB = ["--model", "qwen2.5-7b", "--vram", "8GiB", "--weights", "5.0GiB"]
QWEN_8GIB += ["--overhead", "1.5GiB", "--max-prompt-tokens", "3000"]
QWEN_8GIB += ["--max-completion-tokens", "1000", "--alpha", "0.8"]
# The textbook example lets the engine take the whole card; vLLM's default takes 0.9 of it.
QWEN_8GIB += ["--memory-fraction", "1"]
GIB = 1024**3


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads the developer's own Hugging Face cache: ids resolve to presets unless a test
    puts the model in this empty one."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """Run `sidecar plan --json` and parse what it printed."""
    assert main(["plan", *args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_brief_example_derivation(capsys: pytest.CaptureFixture[str]) -> None:
    """The readable output walks through the brief's 8 GiB card and ends at N = 5."""
    assert main(["plan", *QWEN_8GIB]) == 0
    out = capsys.readouterr().out
    assert "2 (K and V) x 28 layers x 4 heads x 128 x 2 B = 57,344 B" in out
    assert "= kv_pool_per_gpu" in out
    assert "1.50 GiB (1,610,612,736 B)" in out
    assert "floor(1,610,612,736 / 229,376,000 x 0.8) = floor(5.62) = 5" in out


def test_8gib_example_at_vllms_default_fraction(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --memory-fraction the engine sizes itself to 0.9 of the 8 GiB card, as vLLM does:
    7.2 GiB - 5 - 1.5 = 751,619,276 B; / 229,376,000 x 0.8 = 2.62 -> 2 permits."""
    out = plan_json(capsys, *QWEN_8GIB[:-2])
    assert (out["kv_pool_bytes"], out["permits"]) == (751_619_276, 2)
    assert out["inputs"]["memory_fraction"] == 0.9
    assert out["input_sources"]["memory_fraction"] == "default"


# vLLM's rule (vllm/v1/worker/gpu_worker.py): KV = total x gpu_memory_utilization - weights -
# the rest (activations, non-torch memory), here a declared 2 GiB overhead. Hand-computed:
VLLM_RULE = [
    # 80 GiB = 85,899,345,920 B; x 0.9 = 77,309,411,328; - 16,060,522,496 - 2,147,483,648
    pytest.param("llama-3.1-8b", "80GiB", 59_101_405_184, id="llama-3.1-8b-h100"),
    # 141 GiB = 151,397,597,184 B; x 0.9 = 136,257,837,465.6 -> 136,257,837,465; - the same
    pytest.param("llama-3.1-8b", "141GiB", 118_049_831_321, id="llama-3.1-8b-h200"),
    # 77,309,411,328 - 65,248,815,744 (MXFP4 weights) - 2,147,483,648
    pytest.param("gpt-oss-120b", "80GiB", 9_913_111_936, id="gpt-oss-120b-h100"),
]


@pytest.mark.parametrize(("model", "vram", "rule"), VLLM_RULE)
def test_plan_sizes_the_pool_as_vllm_does(
    capsys: pytest.CaptureFixture[str], model: str, vram: str, rule: int
) -> None:
    """With a declared overhead, `sidecar plan` sizes the pool on vLLM's own rule, to the byte."""
    out = plan_json(capsys, "--model", model, "--vram", vram, "--overhead", "2GiB")
    assert out["kv_pool_bytes_per_gpu"] == rule


def test_gpu_preset_and_estimated_overhead(capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu h100-80gb is 79.22 GiB as CUDA reports it; with no --overhead the parts are
    estimated from Llama-3.1-8B's widths at vLLM's H100 serve defaults (8,192 tokens, 1,024
    sequences) and add up to the overhead the pool subtracts."""
    out = plan_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100-80gb")
    terms = {t["name"]: t for t in out["terms"]}
    assert (terms["vram_total"]["bytes"], terms["vram_total"]["source"]) == (
        85_061_827_297,
        "preset",
    )
    parts = ("activation_peak", "non_torch", "cuda_graphs")
    # the sampler's 1,024 x 128,256 x 32 B beside the kept 8,192 x 4,096 x 2 B output
    assert terms["activation_peak"]["bytes"] == 1024 * 128_256 * 32 + 8192 * 4096 * 2
    assert terms["overhead"]["bytes"] == sum(terms[name]["bytes"] for name in parts)
    assert terms["overhead"]["source"] == "estimated"
    assert out["input_sources"]["max_num_batched_tokens"] == "default"
    share, weights = terms["engine_share"]["bytes"], terms["weights"]["bytes"]
    assert out["kv_pool_bytes_per_gpu"] == share - weights - terms["overhead"]["bytes"]


def test_declared_settings_and_graph_memory_reach_the_estimate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--max-num-batched-tokens, --max-num-seqs and --cuda-graph-memory are used as given."""
    out = plan_json(
        capsys,
        *["--model", "llama-3.1-8b", "--vram", "24GiB", "--max-num-batched-tokens", "4096"],
        *["--max-num-seqs", "16", "--cuda-graph-memory", "0"],
    )
    terms = {t["name"]: (t["bytes"], t["source"]) for t in out["terms"]}
    assert terms["activation_peak"] == (4096 * 110_592, "estimated")  # over 16 x 128,256 x 32 B
    assert terms["cuda_graphs"] == (0, "declared")
    assert out["input_sources"]["max_num_seqs"] == "declared"


def test_a_config_without_widths_keeps_the_stated_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """GPT-2's config names no hidden_size/intermediate_size: 2 GiB stands in, and says why."""
    args = ["--model", str(CONFIGS / "gpt2.json"), "--vram", "24GiB", "--weights", "1GiB"]
    out = plan_json(capsys, *args)
    overhead = next(t for t in out["terms"] if t["name"] == "overhead")
    assert (overhead["bytes"], overhead["source"]) == (2 * GIB, "default")
    assert "tells no widths" in overhead["detail"]


def test_brief_example_json(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one object with the numbers and the inputs with their sources."""
    out = plan_json(capsys, *QWEN_8GIB)
    assert out["kv_bytes_per_token"] == 57_344
    assert out["request_max_tokens"] == 4_000
    assert out["request_max_bytes"] == 229_376_000
    assert out["kv_pool_bytes"] == 1_610_612_736
    assert out["permits"] == 5
    terms = {t["name"]: (t["bytes"], t["source"]) for t in out["terms"]}
    assert terms["vram_total"] == (8 * 1024**3, "declared")
    assert terms["overhead"] == (1_610_612_736, "declared")


def test_vllm_tiny_model_agreement(capsys: pytest.CaptureFixture[str]) -> None:
    """1 GiB pool, 1,024-token requests, alpha 1: vLLM's 1,048,576 tokens and 1,024 requests."""
    out = plan_json(
        capsys,
        *["--model", str(CONFIGS / "tiny-llama.json"), "--kv-pool", "1GiB"],
        *["--max-tokens", "1024", "--alpha", "1", "--block-size", "128"],
    )
    assert (out["kv_pool_tokens"], out["permits"]) == (1_048_576, 1_024)


def test_weights_auto_sums_the_model_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--weights auto measures the weight files next to config.json."""
    (tmp_path / "config.json").write_text((CONFIGS / "tiny-llama.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    out = plan_json(
        capsys, "--model", str(tmp_path), "--vram", "1MiB", "--weights", "auto", "--overhead", "0"
    )
    weights = next(t for t in out["terms"] if t["name"] == "weights")
    assert (weights["bytes"], weights["source"]) == (4096, "measured")


def test_tp_and_dtype_flags_reach_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """--tp splits weights and heads; --kv-dtype fp8 halves the bf16 cache."""
    out = plan_json(
        capsys,
        *["--model", "llama-3.1-8b", "--vram", "24GiB", "--weights", "16GiB"],
        *["--overhead", "2GiB", "--tp", "2", "--kv-dtype", "fp8"],
    )
    assert out["kv_bytes_per_token_per_gpu"] == 32_768
    # 24 GiB x 0.9 = 23,192,823,398 B (rounded down) - 8 GiB weights per GPU - 2 GiB
    assert out["kv_pool_bytes_per_gpu"] == 12_455_405_158
    assert out["inputs"]["tensor_parallel_size"] == 2


def test_hybrid_model_shows_its_state(capsys: pytest.CaptureFixture[str]) -> None:
    """A hybrid model's derivation names the constant state and the window, as they apply."""
    assert main(["plan", "--model", "jamba-1.5-mini", "--kv-pool", "10GiB"]) == 0
    assert "28 mamba/linear layers: 8.31 MiB (8,716,288 B) per request" in capsys.readouterr().out
    assert main(["plan", "--model", "mistral-7b", "--kv-pool", "10GiB"]) == 0
    assert "32 layers hold at most 4,096 tokens" in capsys.readouterr().out


BAD_INPUTS = [
    pytest.param(["--alpha", "0"], "alpha (safety factor) must be in (0, 1]", id="alpha-zero"),
    pytest.param(["--alpha", "1.5"], "alpha (safety factor) must be in (0, 1]", id="alpha-big"),
    pytest.param(["--max-tokens", "0"], "--max-tokens must be a positive", id="zero-tokens"),
    pytest.param(
        ["--max-prompt-tokens", "-5"], "--max-prompt-tokens must be a positive", id="neg-prompt"
    ),
    pytest.param(
        ["--max-tokens", "10", "--max-completion-tokens", "5"], "give --max-tokens or", id="both"
    ),
    pytest.param(["--vram", "eight"], "cannot read size 'eight'", id="bad-size"),
    pytest.param(["--overhead", "3GiB"], "no room for a KV cache", id="no-room"),
    pytest.param(["--kv-dtype", "int3"], "unknown KV cache dtype 'int3'", id="bad-dtype"),
    pytest.param(["--weights", "auto"], "needs a model directory", id="auto-without-dir"),
    pytest.param(["--kv-pool", "1GiB"], "either --kv-pool or --vram", id="pool-and-vram"),
    pytest.param(
        ["--memory-fraction", "1.2"],
        "--memory-fraction: the engine's memory fraction must be in (0, 1], got 1.2",
        id="fraction-above-one",
    ),
    pytest.param(["--memory-fraction", "0"], "must be in (0, 1], got 0.0", id="fraction-zero"),
    pytest.param(["--gpu", "h100-80gb"], "give --vram or --gpu, not both", id="vram-and-gpu"),
    pytest.param(
        ["--max-num-seqs", "64"], "--overhead is the whole overhead", id="overhead-and-settings"
    ),
]


def test_a_declared_pool_takes_no_vllm_settings(capsys: pytest.CaptureFixture[str]) -> None:
    """--kv-pool is the pool itself: a vLLM setting beside it would size nothing."""
    args = ["--model", "qwen2.5-7b", "--kv-pool", "1GiB", "--enforce-eager"]
    assert main(["plan", *args]) == 2
    assert "--kv-pool is the pool" in capsys.readouterr().err


@pytest.mark.parametrize(("extra", "message"), BAD_INPUTS)
def test_bad_input_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """Each bad input exits 2 with one line on stderr that says what is wrong."""
    base = ["--model", "qwen2.5-7b", "--vram", "8GiB", "--weights", "5GiB", "--overhead", "1GiB"]
    assert main(["plan", *base, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("sidecar plan: error: ")
    assert message in err


@pytest.mark.parametrize(
    ("model", "message"),
    [
        pytest.param("no-such-model", "no preset of that name", id="missing"),
        pytest.param(str(CONFIGS / "llava-1.5-7b.json"), "none of num_attention_heads", id="bad"),
    ],
)
def test_bad_model_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], model: str, message: str
) -> None:
    """A missing or unusable config exits 2 with one line."""
    assert main(["plan", "--model", model, "--kv-pool", "1GiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message in err


def test_missing_memory_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --vram or --kv-pool the user is told what to give."""
    assert main(["plan", "--model", "qwen2.5-7b"]) == 2
    assert "give --vram or --gpu (and --overhead), or --kv-pool" in capsys.readouterr().err


def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A non-numeric --tp is refused by argparse before any work, with its usual message."""
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--model", "qwen2.5-7b", "--kv-pool", "1GiB", "--tp", "two"])
    assert exit_info.value.code == 2
    assert "argument --tp: invalid int value: 'two'" in capsys.readouterr().err


def test_python_m_sidecar_plan_runs_without_traceback() -> None:
    """`python -m sidecar plan` works, and a bad size gives no traceback."""
    ok = subprocess.run(
        [sys.executable, "-m", "sidecar", "plan", *QWEN_8GIB, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0
    assert json.loads(ok.stdout)["permits"] == 5
    bad = subprocess.run(
        [sys.executable, "-m", "sidecar", "plan", "--model", "qwen2.5-7b", "--kv-pool", "lots"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "cannot read size 'lots'" in bad.stderr


def test_preset_weights_need_no_weights_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """`--model llama-3.1-8b --vram 80GiB` plans with the preset's published weights, and says so
    (here beside a declared 2 GiB overhead).

    80 GiB x 0.9 - 16,060,522,496 B - 2 GiB = 59,101,405,184 B; 4,000 x 131,072 B =
    524,288,000 B per request; 59,101,405,184 / 524,288,000 x 0.8 = 90.18 -> 90."""
    args = ["--model", "llama-3.1-8b", "--vram", "80GiB", "--overhead", "2GiB"]
    assert main(["plan", *args]) == 0
    out = capsys.readouterr().out
    assert "- weights                  14.96 GiB (16,060,522,496 B)  preset" in out
    assert "- overhead                   2.00 GiB (2,147,483,648 B)  declared" in out
    assert "weights: model.safetensors.index.json total_size of meta-llama/Llama-3.1-8B" in out
    assert "x 0.9 = engine_share       72.00 GiB (77,309,411,328 B)  derived" in out
    assert "floor(59,101,405,184 / 524,288,000 x 0.8) = floor(90.18) = 90" in out
    assert "--memory-fraction 0.9 (not given)" in out


@pytest.mark.parametrize(
    ("extra", "sources"),
    [
        pytest.param(
            [],
            {"weights": "preset", "overhead": "estimated", "neighbours": "default"},
            id="preset-weights-estimated-overhead",
        ),
        pytest.param(
            ["--weights", "15GB", "--overhead", "2GiB"],
            {"weights": "declared", "overhead": "declared", "vram_total": "declared"},
            id="typed-is-declared-even-at-the-default-value",
        ),
        pytest.param(
            ["--tp", "2"],
            {"weights": "preset", "weights_per_gpu": "derived", "kv_pool_per_gpu": "derived"},
            id="split-weights-derived",
        ),
    ],
)
def test_each_term_says_where_it_came_from(
    capsys: pytest.CaptureFixture[str], extra: list[str], sources: dict[str, str]
) -> None:
    """A typed value is declared, an untouched default is default, a preset's figure preset,
    a computed one derived."""
    out = plan_json(capsys, "--model", "llama-3.1-8b", "--vram", "80GiB", *extra)
    got = {t["name"]: t["source"] for t in out["terms"]}
    assert {name: got[name] for name in sources} == sources


@pytest.mark.parametrize(
    ("extra", "sources"),
    [
        pytest.param(
            [],
            {
                "kv_dtype": "default",
                "tensor_parallel_size": "default",
                "max_prompt_tokens": "default",
                "max_completion_tokens": "default",
                "alpha": "default",
            },
            id="all-defaults",
        ),
        pytest.param(
            ["--alpha", "0.8", "--tp", "1", "--kv-dtype", "auto", "--max-tokens", "4000"],
            {
                "kv_dtype": "declared",
                "tensor_parallel_size": "declared",
                "max_tokens": "declared",
                "alpha": "declared",
            },
            id="typed-defaults-are-declared",
        ),
    ],
)
def test_inputs_say_whether_they_were_given(
    capsys: pytest.CaptureFixture[str], extra: list[str], sources: dict[str, str]
) -> None:
    """--json's input_sources tell a typed input from a default one, even at the same value."""
    out = plan_json(capsys, "--model", "qwen2.5-7b", "--kv-pool", "10GiB", *extra)
    assert out["input_sources"] == sources


def test_defaults_are_listed_in_the_derivation(capsys: pytest.CaptureFixture[str]) -> None:
    """The readable form names every input nobody gave."""
    assert main(["plan", "--model", "qwen2.5-7b", "--kv-pool", "10GiB", "--tp", "2"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        "defaults     --kv-dtype auto, --max-prompt-tokens 3000, "
        "--max-completion-tokens 1000, --alpha 0.8 (not given)"
    )


@pytest.mark.parametrize(
    ("model", "tp", "rule"),
    [
        pytest.param(
            "llama-3.1-8b",
            "3",
            "the 8 KV heads must divide evenly over the GPUs or the GPUs over them",
            id="tp3-8-kv-heads",
        ),
        pytest.param(
            "qwen2.5-7b",
            "7",
            "(4 % 7 = 4, 7 % 4 = 3; vLLM QKVParallelLinear). Sizes it accepts: 1, 2, 4, 28",
            id="tp7-4-kv-heads",
        ),
        pytest.param(
            "gpt-oss-20b",
            "3",
            "the 64 attention heads must divide evenly over the GPUs (64 % 3 = 1",
            id="tp3-64-heads",
        ),
    ],
)
def test_tp_vllm_refuses_is_one_clear_line(model: str, tp: str, rule: str) -> None:
    """A TP size vLLM refuses exits 2 with one line naming the rule, never a traceback."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar",
            "plan",
            "--model",
            model,
            "--kv-pool",
            "1GiB",
            "--tp",
            tp,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(f"sidecar plan: error: vLLM refuses tensor parallel size {tp} ")
    assert done.stderr.count("\n") == 1
    assert rule in done.stderr


def test_hub_id_from_the_local_cache(
    capsys: pytest.CaptureFixture[str], empty_hub_cache: Path
) -> None:
    """An id in HF_HUB_CACHE plans with its cached config and measured weights, and says where."""
    snapshot = empty_hub_cache / "models--acme--tiny" / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((CONFIGS / "tiny-llama.json").read_text())
    (snapshot / "model.safetensors").write_bytes(b"\0" * 4096)
    out = plan_json(capsys, "--model", "acme/tiny", "--vram", "1MiB", "--overhead", "0")
    weights = next(t for t in out["terms"] if t["name"] == "weights")
    assert (weights["bytes"], weights["source"]) == (4096, "measured")
    assert out["model_found"] == f"local Hugging Face cache: {snapshot}"
    assert main(["plan", "--model", "acme/tiny", "--vram", "1MiB", "--overhead", "0"]) == 0
    assert f"found        local Hugging Face cache: {snapshot}" in capsys.readouterr().out


def test_config_without_weights_asks_for_them(capsys: pytest.CaptureFixture[str]) -> None:
    """A bare config.json tells no weight size: the error says to give --weights."""
    tiny = str(CONFIGS / "tiny-llama.json")
    assert main(["plan", "--model", tiny, "--vram", "1GiB"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"sidecar plan: error: give --weights: {tiny} tells no weight size (or give --kv-pool)\n"
    )
