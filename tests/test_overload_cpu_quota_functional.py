"""The sidecar's cgroup on a real cgroup v1 cpu controller (skipped where it is not writable):
it holds what is started in it, throttles it, and goes with its neighbour when the run ends."""

from __future__ import annotations

import subprocess
import time

import pytest

from benchmarks.overload.cpu_quota import SidecarCpu, check_writable, cpu_group
from benchmarks.overload.plan import SettingError
from benchmarks.overload.servers import stop


def _writable() -> bool:
    try:
        check_writable(SidecarCpu(cores=1.0))
    except SettingError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _writable(), reason="no writable cgroup v1 cpu controller")


def test_the_group_holds_the_sidecar_and_its_neighbour_under_the_quota() -> None:
    """A stand-in for the sidecar started behind the group's prefix keeps its PID and is in
    the group beside the neighbour; the spinning neighbour is throttled at a fifth of a core;
    afterwards both are gone and so is the group."""
    with cpu_group(SidecarCpu(cores=0.2, neighbour=True), "test") as group:
        assert group.neighbour is not None
        sidecar = subprocess.Popen([*group.prefix(), "sleep", "30"], start_new_session=True)
        time.sleep(1.0)  # the kernel's throttling, in real time
        held = set((group.path / "cgroup.procs").read_text().split())
        usage = group.usage()
        stop(sidecar)
    assert {str(sidecar.pid), str(group.neighbour.pid)} <= held
    assert usage["nr_throttled"] >= 3
    assert 0.05 < usage["neighbour_cpu_s"] < 0.6
    assert group.neighbour.poll() is not None
    assert not group.path.exists()


def test_the_group_goes_whatever_ends_the_run() -> None:
    """An error inside the run still stops the neighbour (by its PID) and removes the group."""
    with (
        pytest.raises(RuntimeError, match="the run failed"),
        cpu_group(SidecarCpu(cores=1.0, neighbour=True), "failing") as group,
    ):
        raise RuntimeError("the run failed")
    assert group.neighbour is not None
    assert group.neighbour.poll() is not None
    assert not group.path.exists()
