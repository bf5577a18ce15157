"""The overload bench's sidecar under a CPU quota beside a busy neighbour: the settings that ask
for it, the clear stop where the machine cannot give it, and a neighbour that never outlives the
run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.overload.__main__ import main
from benchmarks.overload.cpu_quota import SidecarCpu, sidecar_cpu
from benchmarks.overload.neighbour import spin
from benchmarks.overload.plan import SettingError

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize(
    ("env", "cores", "quota_us", "neighbour"),
    [
        pytest.param({}, None, -1, False, id="unset-none"),
        pytest.param({"OVERLOAD_SIDECAR_QUOTA": "1"}, 1.0, 100_000, False, id="one-core"),
        pytest.param({"OVERLOAD_SIDECAR_QUOTA": "0.5"}, 0.5, 50_000, False, id="half-a-core"),
        pytest.param({"OVERLOAD_SIDECAR_QUOTA": "0"}, None, -1, False, id="zero-none"),
        pytest.param({"OVERLOAD_NEIGHBOUR": "1"}, None, -1, True, id="a-neighbour-no-quota"),
        pytest.param(
            {"OVERLOAD_SIDECAR_QUOTA": "1", "OVERLOAD_NEIGHBOUR": "1"},
            1.0,
            100_000,
            True,
            id="the-pods-case",
        ),
    ],
)
def test_the_settings_give_the_sidecars_cpu(
    env: dict[str, str], cores: float | None, quota_us: int, neighbour: bool
) -> None:
    """The quota in cores becomes the group's share of each 100 ms period (-1: none)."""
    cpu = sidecar_cpu(env)
    assert (cpu.cores, cpu.quota_us, cpu.neighbour) == (cores, quota_us, neighbour)


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        pytest.param({"OVERLOAD_SIDECAR_QUOTA": "one"}, "OVERLOAD_SIDECAR_QUOTA", id="a-word"),
        pytest.param({"OVERLOAD_SIDECAR_QUOTA": "-1"}, "OVERLOAD_SIDECAR_QUOTA", id="negative"),
        pytest.param({"OVERLOAD_SIDECAR_QUOTA": "0.001"}, "OVERLOAD_SIDECAR_QUOTA", id="under-1ms"),
        pytest.param({"OVERLOAD_SIDECAR_QUOTA": "inf"}, "OVERLOAD_SIDECAR_QUOTA", id="infinite"),
        pytest.param({"OVERLOAD_SIDECAR_QUOTA": "nan"}, "OVERLOAD_SIDECAR_QUOTA", id="nan"),
        pytest.param({"OVERLOAD_NEIGHBOUR": "yes"}, "OVERLOAD_NEIGHBOUR", id="neighbour-yes"),
        pytest.param({"OVERLOAD_NEIGHBOUR": "2"}, "OVERLOAD_NEIGHBOUR", id="neighbour-2"),
    ],
)
def test_a_setting_that_cannot_be_used_is_named(env: dict[str, str], setting: str) -> None:
    """One line, naming the setting and what it got."""
    with pytest.raises(SettingError, match=rf"^{setting}: .*got '") as caught:
        sidecar_cpu(env)
    assert "\n" not in str(caught.value)


def test_without_writable_cgroups_the_run_stops_at_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asked for a quota and a neighbour on a machine with no cgroup to write: exit 2 and one
    line naming both settings, before any engine starts."""
    env = {"OVERLOAD_SIDECAR_QUOTA": "1", "OVERLOAD_NEIGHBOUR": "1"}
    assert main(env, cpu_root=tmp_path / "no-cgroup-here") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("bench-overload: OVERLOAD_SIDECAR_QUOTA and OVERLOAD_NEIGHBOUR: need ")
    assert str(tmp_path / "no-cgroup-here") in err


def test_a_bad_setting_stops_the_command_without_a_traceback() -> None:
    """`python -m benchmarks.overload` with a sweep it cannot read: exit 2, one line."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.overload"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OVERLOAD_SWEEP": "lots"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        "bench-overload: OVERLOAD_SWEEP: need client counts of 1 or more like 24,36,48, or "
        "none; got 'lots'"
    ]


def test_the_neighbour_stops_once_its_benchmark_is_gone() -> None:
    """It spins while its parent is the benchmark that started it; handed to another parent
    (the benchmark killed), it ends instead of spinning on forever."""
    parents = iter([40, 40, 40, 1])
    assert spin(40, getppid=lambda: next(parents)) == 3


def test_the_record_names_the_quota_and_the_neighbour() -> None:
    """The run's JSON keeps what was in force."""
    assert SidecarCpu(cores=0.5, neighbour=True).record() == {
        "quota_cores": 0.5,
        "cfs_period_us": 100_000,
        "cfs_quota_us": 50_000,
        "neighbour": True,
    }
