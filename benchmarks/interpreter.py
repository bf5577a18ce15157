"""Which CPython build runs the benchmarks, and so the sidecar: a build moves every figure.

The same sidecar counted 8.5% more instructions per request and timed 11-28% slower per admission
on pyenv's default build (no PGO or LTO, libpython loaded as a shared library) than on Debian's
``python3.11`` (profile-guided, libpython linked in): docs/performance.md, the twelfth pass. The
image's ``python:3.11-slim`` is built with ``--enable-optimizations --with-lto``; ``make bench
BENCH_PYTHON=...`` measures on another interpreter than the project's own.
"""

from __future__ import annotations

import os
import platform
import sys
import sysconfig
from pathlib import Path
from typing import TypedDict


class Build(TypedDict):
    """What a reader needs to compare two runs' interpreters."""

    version: str
    executable: str
    libpython: str  # "shared" (a .so, called through the PLT) or "linked in"
    configured: list[str]  # the optimisation options of ./configure, as given


OPTIONS = ("--enable-optimizations", "--with-lto")


def build(maps: Path = Path("/proc/self/maps")) -> Build:
    """This interpreter's build. ``libpython`` is read from the process's mapped files (Linux);
    a distribution may optimise its own way without these configure options (Debian does)."""
    try:
        mapped = maps.read_text()
    except OSError:
        mapped = ""
    shared = "libpython" in mapped
    config = str(sysconfig.get_config_var("CONFIG_ARGS") or "")
    return Build(
        version=f"{platform.python_implementation()} {platform.python_version()}",
        executable=os.path.realpath(sys.executable),  # a venv's python is a link to it
        libpython="shared" if shared else "linked in",
        configured=[option for option in OPTIONS if option in config],
    )


def describe(info: Build | None = None) -> str:
    """One line, for a bench's header."""
    info = info or build()
    if info["configured"]:
        options = "configured with " + " ".join(info["configured"])
    else:  # Debian's python3.11 is profile-guided all the same
        options = f"configured without {' or '.join(OPTIONS)} (a distribution may still use PGO)"
    return (
        f"interpreter: {info['version']} ({info['executable']}), libpython {info['libpython']}, "
        + options
    )
