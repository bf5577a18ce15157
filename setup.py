"""The build. Pure Python unless SIDECAR_COMPILE=1, which compiles the request path with mypyc.

Everything else about the package is in pyproject.toml. A compiled build runs the same source as
C extension modules (docs/performance.md, "Compiled"); it needs a C compiler, Python's headers and
mypy at build time, and nothing more at run time. Where an extension module is missing, its
``.py`` runs instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import setup

# The layers on a request's path, compiled whole; start-up, settings, probes and the CLI stay
# Python (they run once, or once a tick, off the request's path).
COMPILED_LAYERS = ("sidecar/core", "sidecar/limiter", "sidecar/edge", "sidecar/telemetry")
# Left as Python: what mypyc cannot compile, or compiles into something else.
LEFT_AS_PYTHON = frozenset(
    {
        "sidecar/core/errors.py",  # UnknownTicketError is a KeyError
        "sidecar/edge/wire_errors.py",  # subclasses of ConnectionResetError and ValueError
        "sidecar/telemetry/module_log.py",  # a class that fills its slots from __getattr__
    }
)


def compiled_paths() -> list[str]:
    """The modules a compiled build turns into extension modules."""
    return [
        str(path)
        for layer in COMPILED_LAYERS
        for path in sorted(Path(layer).glob("*.py"))
        if str(path) not in LEFT_AS_PYTHON and path.name != "__init__.py"
    ]


def main() -> None:
    if os.environ.get("SIDECAR_COMPILE") == "1":
        from mypyc.build import mypycify

        setup(ext_modules=mypycify(compiled_paths(), opt_level="3", group_name="sidecar"))
    else:
        setup()


if __name__ == "__main__":  # as setuptools runs it; imported (tests, benchmarks), it builds nothing
    main()
