"""Which build of the sidecar runs: the request path compiled (mypyc), or all of it as Python.

A compiled build (``SIDECAR_COMPILE=1`` at build time, as the image is built: setup.py) turns the
modules of the request's layers into C extension modules; the same source runs about twice as few
instructions per request and per relayed event (docs/performance.md, the fourteenth pass).
Where a module's extension is missing, its ``.py`` runs instead, so a build is told by what it
loads, not by how it was asked for: ``sidecar --version`` and the ``sidecar_listening`` line say.
"""

from __future__ import annotations

import importlib.util
import pkgutil
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Literal

# The packages a compiled build compiles (setup.py's COMPILED_LAYERS, as module names).
COMPILED_PACKAGES = ("sidecar.core", "sidecar.limiter", "sidecar.edge", "sidecar.telemetry")

BuildKind = Literal["compiled", "python"]


def compiled_modules(packages: tuple[str, ...] = COMPILED_PACKAGES) -> tuple[list[str], int]:
    """The modules of ``packages`` found as extension modules, and how many modules they have;
    found without importing them."""
    compiled, total = [], 0
    for package in packages:
        spec = importlib.util.find_spec(package)
        locations = spec.submodule_search_locations if spec is not None else None
        for info in pkgutil.iter_modules(list(locations or ())):
            name = f"{package}.{info.name}"
            found = importlib.util.find_spec(name)
            total += 1
            origin = found.origin if found is not None else None
            if origin is not None and origin.endswith(tuple(EXTENSION_SUFFIXES)):
                compiled.append(name)
    return compiled, total


def build_kind() -> BuildKind:
    """ "compiled" when any module of the request's layers is an extension module (a compiled
    build leaves a few as Python, on purpose: setup.py), "python" when none is."""
    compiled, _ = compiled_modules()
    return "compiled" if compiled else "python"


def describe() -> str:
    """One line: the build, for ``--version``."""
    compiled, total = compiled_modules()
    if not compiled:
        return "pure Python"
    return f"compiled with mypyc, {len(compiled)} of {total} request-path modules"
