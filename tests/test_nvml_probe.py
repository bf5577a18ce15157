"""The NVML probe against the real nvidia-ml-py binding over a C double of libnvidia-ml.so.1.

The double (tests/nvml_double/) is built with gcc and loaded through LD_LIBRARY_PATH in a
subprocess, so pynvml's own ctypes structures, symbol names and error classes run for real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.errors import ProbeTemporaryError, ProbeUnavailableError
from sidecar.live.probes import nvml_errors
from sidecar.live.probes.nvml import NvmlProbe, parse_gpu_selection

DOUBLE_SOURCE = Path(__file__).parent / "nvml_double" / "nvml_double.c"
GIB = 1024**3

# Reads each frame of a timeline with ONE probe (NVML initialised once), printing JSON per read.
DRIVER = """
import dataclasses, json, sys
from pathlib import Path
from sidecar.core.errors import ProbeError
from sidecar.live.probes.nvml import NvmlProbe, parse_gpu_selection
script, selection, frames = Path(sys.argv[1]), sys.argv[2], json.loads(sys.stdin.read())
probe = NvmlProbe(parse_gpu_selection(selection), clock=lambda: 0.0)
for frame in frames:
    script.write_text(frame)
    try:
        print(json.dumps(dataclasses.asdict(probe.read_now())))
    except ProbeError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


@pytest.fixture(scope="session")
def double_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the freshly built libnvidia-ml.so.1 double."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the NVML double")
    out = tmp_path_factory.mktemp("nvml-double")
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-Wall",
            "-Werror",
            "-o",
            str(out / "libnvidia-ml.so.1"),
            str(DOUBLE_SOURCE),
        ],
        check=True,
    )
    return out


def read_timeline(
    library_dir: Path, tmp_path: Path, frames: list[str], selection: str = ""
) -> list[dict[str, Any]]:
    """Run the real binding over the double, one probe read per scripted frame."""
    script = tmp_path / "gpu.txt"
    env = os.environ | {
        "LD_LIBRARY_PATH": str(library_dir),
        "NVML_DOUBLE_SCRIPT": str(script),
    }
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(script), selection],
        input=json.dumps(frames),
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


H100 = "gpu {total} {used} {free} 536870912 1 -1 GPU-0000 NVIDIA H100 80GB HBM3\n"


def frame(used: int, procs: list[tuple[int, int]], total: int = 80 * GIB) -> str:
    lines = [H100.format(total=total, used=used, free=total - used)]
    lines += [f"proc 0 {pid} {size}\n" for pid, size in procs]
    return "".join(lines)


def test_timeline_neighbour_growth_loss_and_return(double_dir: Path, tmp_path: Path) -> None:
    """A neighbour appears, memory grows, the GPU is lost and comes back: each read tells."""
    frames = [
        frame(20 * GIB, [(100, 19 * GIB)]),
        frame(24 * GIB, [(100, 19 * GIB), (200, 4 * GIB)]),
        frame(30 * GIB, [(100, 25 * GIB), (200, 4 * GIB)]),
        "rc 15\n" + frame(30 * GIB, []),
        frame(21 * GIB, [(100, 20 * GIB)]),
    ]
    reads = read_timeline(double_dir, tmp_path, frames)
    gpus = [r["gpus"][0] if "gpus" in r else r for r in reads]
    assert [len(g["processes"]) for g in gpus if "processes" in g] == [1, 2, 2, 1]
    assert gpus[1]["processes"][1] == {"pid": 200, "used_bytes": 4 * GIB}
    assert [g.get("used_bytes") for g in gpus] == [20 * GIB, 24 * GIB, 30 * GIB, None, 21 * GIB]
    assert gpus[3] == {
        "error": "ProbeTemporaryError",
        "message": "NVML nvmlDeviceGetCount: the GPU is lost (code 15)",
    }
    assert (gpus[0]["name"], gpus[0]["uuid"], gpus[0]["reserved_bytes"]) == (
        "NVIDIA H100 80GB HBM3",
        "GPU-0000",
        536870912,
    )


def test_old_driver_falls_back_to_memory_info_v1(double_dir: Path, tmp_path: Path) -> None:
    """Without nvmlDeviceGetMemoryInfo_v2 the probe reads v1 and reports no reserved figure."""
    old = frame(GIB, []).replace(" 536870912 1 ", " 536870912 0 ")
    [reading] = read_timeline(double_dir, tmp_path, [old])
    gpu = reading["gpus"][0]
    assert (gpu["total_bytes"], gpu["used_bytes"], gpu["reserved_bytes"]) == (80 * GIB, GIB, None)


@pytest.mark.parametrize(
    ("selection", "names"),
    [
        pytest.param("", ["GPU-A", "GPU-B"], id="all-visible"),
        pytest.param("1", ["GPU-B"], id="by-index"),
        pytest.param("GPU-B,GPU-A", ["GPU-B", "GPU-A"], id="by-uuid"),
    ],
)
def test_gpu_selection(double_dir: Path, tmp_path: Path, selection: str, names: list[str]) -> None:
    """SIDECAR_GPUS picks GPUs by index or UUID; empty means every visible GPU."""
    two = "gpu 100 10 90 0 1 -1 GPU-A First\ngpu 200 20 180 0 1 1 GPU-B Second\n"
    [reading] = read_timeline(double_dir, tmp_path, [two], selection)
    gpus = reading["gpus"]
    assert [g["uuid"] for g in gpus] == names
    assert {g["uuid"]: g["mig_enabled"] for g in gpus}.get("GPU-B", True) is True


@pytest.mark.parametrize(
    ("script", "error", "message"),
    [
        pytest.param(
            "init_rc 9\n", "ProbeUnavailableError", "driver is not loaded", id="no-driver"
        ),
        pytest.param("init_rc 18\n", "ProbeUnavailableError", "version mismatch", id="mismatch"),
        pytest.param(
            "rc 4\ngpu 1 0 1 0 1 -1 G x\n",
            "ProbeUnavailableError",
            "no permission",
            id="no-permission",
        ),
        pytest.param(
            "gpu 1 0 1 0 1 -1 G x\n",
            "ProbeUnavailableError",
            "only 1 are visible",
            id="unknown-index",
        ),
    ],
)
def test_nvml_failures_are_translated(
    double_dir: Path, tmp_path: Path, script: str, error: str, message: str
) -> None:
    """Each NVML failure arrives as our error class with a message a person can act on."""
    [reading] = read_timeline(double_dir, tmp_path, [script], selection="3")
    assert reading["error"] == error
    assert message in str(reading["message"])


def test_missing_library_is_unavailable(tmp_path: Path) -> None:
    """No libnvidia-ml.so.1 anywhere: the probe says so instead of crashing the sidecar."""
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("a real NVIDIA driver is installed here")
    [reading] = read_timeline(tmp_path, tmp_path, [""])
    assert reading == {
        "error": "ProbeUnavailableError",
        "message": "NVML nvmlInit: the NVML library was not found (code 12)",
    }


def test_every_nvml_error_code_is_classified() -> None:
    """Every NVML_ERROR_* the binding knows maps to temporary or unavailable, never both."""
    import pynvml

    codes = {v for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_")}
    classified = set(nvml_errors.TEMPORARY) | set(nvml_errors.UNAVAILABLE)
    assert codes - classified == set()
    assert set(nvml_errors.TEMPORARY) & set(nvml_errors.UNAVAILABLE) == set()


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        pytest.param(15, ProbeTemporaryError, id="gpu-lost"),
        pytest.param(3, ProbeUnavailableError, id="not-supported"),
        pytest.param(12345, ProbeTemporaryError, id="unknown-code"),
    ],
)
def test_translate_picks_the_retry_policy(code: int, kind: type[Exception]) -> None:
    """Temporary errors are retried next tick; unavailable ones are reported as such."""
    assert type(nvml_errors.translate(code, "op")) is kind


def test_gpu_selection_parsing() -> None:
    """Commas and blanks in SIDECAR_GPUS are forgiven."""
    assert parse_gpu_selection(" 0, GPU-x ,") == ("0", "GPU-x")
    assert parse_gpu_selection(None) == ()


@pytest.mark.gpu
async def test_real_gpu_is_read() -> None:
    """On a machine with an NVIDIA driver, every visible GPU reports consistent memory."""
    probe = NvmlProbe()
    snapshot = await probe.read()
    await probe.close()
    assert snapshot.gpus
    for gpu in snapshot.gpus:
        assert gpu.total_bytes > 0
        assert gpu.used_bytes <= gpu.total_bytes
        assert gpu.uuid.startswith(("GPU-", "MIG-"))
