"""The sidecar under a CPU quota shared with a busy neighbour, as a pod runs it: a cgroup (v1
``cpu`` controller) per sidecar run, ``cpu.cfs_quota_us`` of the cores asked for, and a process
spinning beside the sidecar in it (``OVERLOAD_SIDECAR_QUOTA``, ``OVERLOAD_NEIGHBOUR``).

The neighbour is stopped by its PID and the group removed when the run ends, whatever ends it.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.overload.plan import SettingError
from benchmarks.overload.servers import stop

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000  # the kernel's default CFS period
MIN_CORES = 0.01  # the kernel refuses a quota under 1 ms a period
# Runs ``"$@"`` once the shell has joined the group whose ``cgroup.procs`` is "$0": every thread
# and child the program starts is held too, and its PID stays the one started (stopped by it).
JOIN = 'echo 0 > "$0" && exec "$@"'
STAT_FIELDS = ("nr_periods", "nr_throttled", "throttled_time")


@dataclass(frozen=True, slots=True, kw_only=True)
class SidecarCpu:
    """Where each sidecar runs: under a quota of ``cores`` (None: no quota) and beside a busy
    ``neighbour`` process or not."""

    cores: float | None = None
    neighbour: bool = False

    @property
    def held(self) -> bool:
        """Whether the sidecar runs in a cgroup of its own at all."""
        return self.cores is not None or self.neighbour

    @property
    def quota_us(self) -> int:
        """``cpu.cfs_quota_us``: the cores' share of each period; -1 for no quota."""
        return -1 if self.cores is None else round(self.cores * PERIOD_US)

    def settings(self) -> str:
        """The settings in force, by their names."""
        names = (("OVERLOAD_SIDECAR_QUOTA", self.cores), ("OVERLOAD_NEIGHBOUR", self.neighbour))
        return " and ".join(name for name, value in names if value)

    def record(self) -> dict[str, Any]:
        """What the run's JSON keeps of it."""
        return {
            "quota_cores": self.cores,
            "cfs_period_us": PERIOD_US,
            "cfs_quota_us": self.quota_us,
            "neighbour": self.neighbour,
        }


def sidecar_cpu(env: Mapping[str, str]) -> SidecarCpu:
    """``OVERLOAD_SIDECAR_QUOTA`` (cores, e.g. 1 or 0.5; unset or 0: no quota) and
    ``OVERLOAD_NEIGHBOUR`` (1: a busy neighbour; unset or 0: none)."""
    neighbour = env.get("OVERLOAD_NEIGHBOUR", "").strip()
    if neighbour not in ("", "0", "1"):
        raise SettingError(f"OVERLOAD_NEIGHBOUR: need 1 or 0; got {neighbour!r}")
    return SidecarCpu(
        cores=_cores(env.get("OVERLOAD_SIDECAR_QUOTA", "")), neighbour=neighbour == "1"
    )


def _cores(text: str) -> float | None:
    with contextlib.suppress(ValueError):
        cores = float(text.strip() or 0)
        if cores == 0:
            return None
        if MIN_CORES <= cores < math.inf:
            return cores
    raise SettingError(
        f"OVERLOAD_SIDECAR_QUOTA: need cores of {MIN_CORES} or more (e.g. 1 or 0.5), or 0 for "
        f"none; got {text!r}"
    )


@dataclass(frozen=True, slots=True)
class CpuGroup:
    """One cgroup a sidecar runs in, and the neighbour beside it (if any)."""

    path: Path
    neighbour: subprocess.Popen[bytes] | None = None

    def prefix(self) -> tuple[str, ...]:
        """What a command is started behind to run in the group."""
        return ("sh", "-c", JOIN, str(self.path / "cgroup.procs"))

    def usage(self) -> dict[str, float]:
        """The group's throttling counters (``cpu.stat``) and the CPU seconds the neighbour
        has used."""
        lines = (self.path / "cpu.stat").read_text().splitlines()
        found: dict[str, float] = {
            key: int(value) for key, value in (line.split() for line in lines) if key in STAT_FIELDS
        }
        if self.neighbour is not None:
            found["neighbour_cpu_s"] = cpu_seconds(self.neighbour.pid)
        return found


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds a process has used (``/proc/<pid>/stat``; 0 once gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def check_writable(cpu: SidecarCpu, root: Path = CPU_ROOT) -> None:
    """Fail at the start, not in the first sidecar run, where no such group can be made."""
    path = root / f"overload-{os.getpid()}-probe"
    try:
        path.mkdir()
        try:
            (path / "cpu.cfs_quota_us").write_text(str(cpu.quota_us))
        finally:
            path.rmdir()
    except OSError as exc:
        raise SettingError(
            f"{cpu.settings()}: need a writable cgroup v1 cpu controller at {root} "
            f"({exc.strerror or exc}); unset it to run without"
        ) from exc


@contextlib.contextmanager
def cpu_group(cpu: SidecarCpu, name: str, root: Path = CPU_ROOT) -> Iterator[CpuGroup]:
    """A cgroup under ``root`` with ``cpu``'s quota, its neighbour spinning in it if asked;
    the neighbour stopped and the group removed on the way out."""
    path = root / f"overload-{os.getpid()}-{name}"
    path.mkdir()
    try:
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(cpu.quota_us))
        if not cpu.neighbour:
            yield CpuGroup(path)
            return
        command = [*CpuGroup(path).prefix(), sys.executable, "-m", "benchmarks.overload.neighbour"]
        process = subprocess.Popen(command, start_new_session=True)
        try:
            yield CpuGroup(path, process)
            if process.poll() is not None:
                raise RuntimeError(f"the busy neighbour exited early ({process.returncode})")
        finally:
            stop(process, grace_s=5)
    finally:
        _remove(path)


def _remove(path: Path, wait_s: float = 5.0) -> None:
    """Remove the group once its processes have left it (each leaves as it exits)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            path.rmdir()
        except OSError as exc:
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            left = ""
            with contextlib.suppress(OSError):
                left = " ".join((path / "cgroup.procs").read_text().split())
            print(f"could not remove {path} ({exc.strerror}); in it: {left}", file=sys.stderr)
        return
