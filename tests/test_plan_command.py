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
BRIEF_8GIB = ["--model", "qwen2.5-7b", "--vram", "8GiB", "--weights", "5.0GiB"]
BRIEF_8GIB += ["--overhead", "1.5GiB", "--max-prompt-tokens", "3000"]
BRIEF_8GIB += ["--max-completion-tokens", "1000", "--alpha", "0.8"]


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """Run `sidecar plan --json` and parse what it printed."""
    assert main(["plan", *args, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_brief_example_derivation(capsys: pytest.CaptureFixture[str]) -> None:
    """The readable output walks through the brief's 8 GiB card and ends at N = 5."""
    assert main(["plan", *BRIEF_8GIB]) == 0
    out = capsys.readouterr().out
    assert "2 (K and V) x 28 layers x 4 heads x 128 x 2 B = 57,344 B" in out
    assert "= kv_pool_per_gpu" in out
    assert "1.50 GiB (1,610,612,736 B)" in out
    assert "floor(1,610,612,736 / 229,376,000 x 0.8) = floor(5.62) = 5" in out


def test_brief_example_json(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one object with the numbers and the inputs with their sources."""
    out = plan_json(capsys, *BRIEF_8GIB)
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
    assert out["kv_pool_bytes_per_gpu"] == 14 * 1024**3
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
]


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
    """Without --vram/--weights or --kv-pool the user is told what to give."""
    assert main(["plan", "--model", "qwen2.5-7b"]) == 2
    assert "give --vram and --weights" in capsys.readouterr().err


def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A non-numeric --tp is refused by argparse before any work, with its usual message."""
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--model", "qwen2.5-7b", "--kv-pool", "1GiB", "--tp", "two"])
    assert exit_info.value.code == 2
    assert "argument --tp: invalid int value: 'two'" in capsys.readouterr().err


def test_python_m_sidecar_plan_runs_without_traceback() -> None:
    """`python -m sidecar plan` works, and a bad size gives no traceback."""
    ok = subprocess.run(
        [sys.executable, "-m", "sidecar", "plan", *BRIEF_8GIB, "--json"],
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
