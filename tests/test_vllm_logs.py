"""`sidecar plan` against the KV cache vLLM itself sized, as published start-up logs show it.

Each row of tests/fixtures/vllm_startup_logs.json is one log: its GPU, model, settings and the
KV cache vLLM logged. The plan must land within 5 % of it; a row it cannot reach is an xfail
that says why (docs/capacity-math.md, "Agreement with vLLM's logs").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.entry.cli import main

LOGS = Path(__file__).parent / "fixtures" / "vllm_startup_logs.json"
ROWS: list[dict[str, Any]] = json.loads(LOGS.read_text(encoding="utf-8"))["rows"]
ROOT = Path(__file__).parent.parent
GIB = 1024**3
BOUND = 0.05
BLOCK = 16  # vLLM's block size on these GPUs


@pytest.fixture(autouse=True)
def empty_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Model ids resolve to the presets, never to a developer's own Hugging Face cache."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))


def plan_args(row: dict[str, Any]) -> list[str]:
    """`sidecar plan` as the row's deployment: its GPU, model, parallelism and vLLM settings."""
    model = str(ROOT / row["model"]) if row["model"].endswith(".json") else row["model"]
    args = ["plan", "--model", model, "--gpu", row["gpu"], "--weights", row["weights"]]
    args += ["--tp", str(row["tp"]), "--pp", str(row["pp"]), "--kv-dtype", row["kv_cache_dtype"]]
    args += ["--memory-fraction", str(row["gpu_memory_utilization"])]
    args += ["--max-num-batched-tokens", str(row["max_num_batched_tokens"])]
    args += ["--max-num-seqs", str(row["max_num_seqs"]), "--block-size", str(BLOCK)]
    args += ["--max-tokens", str(row["max_model_len"]), "--json"]
    if row["enforce_eager"]:
        args.append("--enforce-eager")
    elif not row["graphs_counted"]:  # this vLLM sized its pool before capturing graphs
        args += ["--cuda-graph-memory", "0"]
    return args


def planned_against_logged(
    row: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> tuple[float, float, str]:
    """(ours, vLLM's, unit): GiB where the log gives GiB, else tokens."""
    assert main(plan_args(row)) == 0
    plan = json.loads(capsys.readouterr().out)
    logged = row["logged"]
    if "kv_cache_gib" in logged:
        return plan["kv_pool_bytes_per_gpu"] / GIB, logged["kv_cache_gib"], "GiB"
    return plan["kv_pool_tokens"], logged["kv_cache_tokens"], "tokens"


def _param(row: dict[str, Any]) -> Any:
    marks = [pytest.mark.xfail(reason=row["xfail"], strict=True)] if row["xfail"] else []
    return pytest.param(row, id=row["id"], marks=marks)


@pytest.mark.parametrize("row", [_param(row) for row in ROWS])
def test_plan_agrees_with_vllms_log(
    row: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The planned pool per GPU is within 5 % of the KV cache the log shows vLLM allocating."""
    ours, theirs, unit = planned_against_logged(row, capsys)
    error = ours / theirs - 1
    with capsys.disabled():  # the measured error of every row, shown whatever the outcome
        print(f"\n{row['id']}: vLLM {theirs:,.2f} {unit}, ours {ours:,.2f} {unit}, {error:+.1%}")
    assert abs(error) <= BOUND, f"{error:+.1%} off vLLM's {theirs} {unit} ({row['url']})"


def test_the_docs_table_is_what_the_planner_says(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/capacity-math.md's table gives each row's error as the planner computes it now."""
    doc = (ROOT / "docs" / "capacity-math.md").read_text(encoding="utf-8")
    table = [line for line in doc.splitlines() if line.startswith("| [vllm#")]
    assert len(table) == len(ROWS)
    for row, line in zip(ROWS, table, strict=True):
        ours, theirs, _ = planned_against_logged(row, capsys)
        assert row["url"] in line
        assert f"| {(ours / theirs - 1) * 100:+.1f} %" in line, (row["id"], line)


def test_the_logs_cover_what_the_planner_must_get_right() -> None:
    """Eight logs or more: dense, MoE and MLA models, TP > 1, at least three kinds of GPU."""
    assert len(ROWS) >= 8
    assert len({row["gpu"] for row in ROWS}) >= 3
    assert any(row["tp"] > 1 for row in ROWS)
    configs = {row["model"] for row in ROWS}
    assert "qwen3-30b-a3b" in configs  # MoE
    assert "tests/configs/deepseek-v2-lite.json" in configs  # MLA
    assert all(row["url"].startswith("https://github.com/vllm-project/vllm/") for row in ROWS)
