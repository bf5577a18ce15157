"""`make test-gpu` where there is no GPU: one clear line, exit 0; and its scenario's own logic,
run over the NVML double with the torch processes played by scripted entries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_nvml_probe import double_dir  # noqa: F401 - the session fixture building the double

ROOT = Path(__file__).parent.parent

# The scenario with each torch process replaced by a line of the double's script: what NVML
# lists is what the "process" holds, plus a 500 MiB CUDA context.
SCRIPTED = """
import itertools, os, sys
from pathlib import Path
import scripts.gpu_scenario as scenario

script, total = Path(os.environ["NVML_DOUBLE_SCRIPT"]), 141 * 1024**3
held, pids = {}, itertools.count(5000)

def write():
    used = sum(held.values())
    lines = [f"gpu {total} {used} {total - used} 0 1 -1 GPU-H200 NVIDIA H200\\n"]
    script.write_text("".join(lines + [f"proc 0 {p} {b}\\n" for p, b in held.items()]))

class Process:
    def __init__(self, pid):
        self.pid = pid
    def kill(self):
        held.pop(self.pid, None)
        write()
    def wait(self, timeout=None):
        return 0

class Holder:
    def __init__(self, python, sizes):
        self.proc, self.reserved = Process(next(pids)), sum(sizes)
        held[self.proc.pid] = self.reserved + 500 * 1024**2
        write()
    pid = property(lambda self: self.proc.pid)
    def stop(self):
        self.proc.kill()

scenario.Holder = Holder
write()
sys.exit(scenario.main())
"""


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


def test_scenario_table_over_the_nvml_double(double_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """On an H200-sized double: the pool is the KV the engine holds, neighbours are headroom, the
    engine's process gone is engine_process_unseen, and every check holds."""
    env = os.environ | {
        "LD_LIBRARY_PATH": str(double_dir),
        "NVML_DOUBLE_SCRIPT": str(tmp_path / "gpu.txt"),
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPTED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 8
    assert all(row.endswith("| yes |") for row in rows)
    assert "nvml 111.39 GiB (+0.000% of KV held)" in rows[0]
    assert "(0.44% apart)" in rows[1]
    assert "others 8.95 GiB, taken 0 B" in rows[4]
    assert "| engine_process_unseen |" in rows[6]
    assert done.stdout.endswith("gpu scenario: all 8 checks held\n")
