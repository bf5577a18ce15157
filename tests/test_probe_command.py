"""``sidecar probe`` in a real process: what it prints, and its exit status when blind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.entry.probe_command import describe
from tests.test_nvml_probe import double_dir  # noqa: F401 - the session fixture building the double

GIB = 1024**3
BASE = {
    "SIDECAR_MODEL": "qwen2.5-7b",
    "SIDECAR_WEIGHTS": "14GiB",
    "SIDECAR_ENGINE_METRICS_URL": "http://127.0.0.1:9/metrics",
}


def probe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "probe", *args],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_probe_shows_gpus_processes_and_the_plan(double_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """Through the NVML double: the GPU, its processes, and the plan from the nvml source."""
    script = tmp_path / "gpu.txt"
    script.write_text(
        f"gpu {80 * GIB} {20 * GIB} {60 * GIB} 0 1 -1 GPU-1234 NVIDIA H100 80GB HBM3\n"
        f"proc 0 4242 {18 * GIB}\nproc 0 777 {GIB}\n"
    )
    env = BASE | {"LD_LIBRARY_PATH": str(double_dir), "NVML_DOUBLE_SCRIPT": str(script)}
    done = probe(env)
    assert done.returncode == 0, done.stderr
    assert "source: nvml (asked: auto), mode: fresh" in done.stdout
    assert "GPU 0 NVIDIA H100 80GB HBM3 GPU-1234" in done.stdout
    assert "pid 777: 1.00 GiB" in done.stdout
    # 80 x 0.9 (vLLM's default) - 14 - 2 = 56 GiB; / 229,376,000 B x 0.8 = 209.7. The 1 GiB
    # neighbour sits in the 8 GiB the engine leaves free: headroom, not pool.
    assert "plan: 209 permits (worst-case requests)" in done.stdout
    assert "headroom on GPU-1234: engine share 72.00 GiB" in done.stdout
    assert "leaves 8.00 GiB (8,589,934,592 B) free; other processes hold 1.00 GiB" in done.stdout
    # The default (slo) admission, without an engine to steer by, starts at the permits and
    # never passes them.
    slo_line = "admission: slo, limit 209 starting streams (steered by the streams' latencies"
    assert slo_line in done.stdout
    adaptive = probe(env | {"SIDECAR_ADMISSION": "adaptive"})
    # Adaptive, without an engine, prices each request at its worst case in tokens against
    # 0.8 x the pool: 0.8 x 56 GiB / 57,344 B = 838,860 tokens.
    assert "admission: adaptive, limit 838,860 tokens (the permits above are not enforced" in (
        adaptive.stdout
    )
    counted = probe(env | {"SIDECAR_ADMISSION": "count"})
    assert "admission: count, limit 209 sequences\n" in counted.stdout
    document = json.loads(probe(env, "--json").stdout)
    assert {t["name"]: t["source"] for t in document["plan"]["terms"]}["neighbours"] == "measured"
    assert document["headroom"][0]["taken_bytes"] == 0


def test_probe_exits_2_with_one_line_when_nothing_can_be_read(tmp_path: Path) -> None:
    """No NVML library and no engine: exit 2 (as docs/cli.md says of every error) and the error
    printed once, on one line of stderr, nothing on stdout; --json prints the document alone."""
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("a real NVIDIA driver is installed here")
    env = BASE | {"LD_LIBRARY_PATH": str(tmp_path), "SIDECAR_WEIGHTS": ""}
    done = probe(env)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("sidecar probe: error: nothing could be read")
    assert done.stderr.count("\n") == 1
    assert done.stderr.count("the NVML library was not found") == 1
    as_json = probe(env, "--json")
    assert (as_json.returncode, as_json.stderr) == (2, "")
    assert "the NVML library was not found" in json.loads(as_json.stdout)["error"]


def test_probe_with_bad_settings_fails_fast() -> None:
    """A configuration error is one line naming the setting, exit status 2, before any probe."""
    done = probe({"SIDECAR_MODEL": "no-such-model"})
    assert done.returncode == 2
    assert done.stderr.startswith("sidecar probe: error: SIDECAR_MODEL: no config.json at ")
    assert "'no-such-model'" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_probe_text_shows_each_standing_warning() -> None:
    """A model_mismatch seen in `probe --json` is also a line of the plain report."""
    document = {
        "source": "vllm",
        "requested_source": "auto",
        "mode": "fresh",
        "gpus": [],
        "engine": None,
        "disagreements": [],
        "plan": None,
        "warnings": [{"code": "model_mismatch", "message": "planning with the engine's"}],
        "error": None,
    }
    assert describe(document) == [
        "source: vllm (asked: auto), mode: fresh",
        "warning model_mismatch: planning with the engine's",
    ]
