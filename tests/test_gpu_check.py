"""`make test-gpu` where there is no GPU: one clear line, exit 0, nothing run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_make_test_gpu_skips_with_one_line_without_a_gpu(tmp_path: Path) -> None:
    """No driver and no nvidia-smi on the PATH: the one line says why, and the exit is 0."""
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("a real NVIDIA driver is installed here")
    env = os.environ | {"PATH": f"{tmp_path}:/usr/bin:/bin"}  # no nvidia-smi in tmp_path
    done = subprocess.run(
        ["make", "-s", "test-gpu"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "make test-gpu: skipped: no NVIDIA GPU here (no /proc/driver/nvidia/version, no nvidia-smi)"
    ]
    assert done.stderr == ""
