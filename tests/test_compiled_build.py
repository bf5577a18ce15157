"""The compiled build (setup.py, ``SIDECAR_COMPILE=1``): what it compiles, the rules its source
keeps so that both builds behave alike, and that a run asked to test it runs it.

``make test-compiled`` runs the whole suite on a compiled copy of the tree with
``EXPECT_COMPILED_BUILD=1``; ``make test`` runs it on the source as it is.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

import setup
from sidecar.core.errors import RequestError, caused
from sidecar.core.request_checks import TokenPolicy, check_request
from sidecar.entry import build

ROOT = Path(setup.__file__).parent
EXPECT_COMPILED = os.environ.get("EXPECT_COMPILED_BUILD") == "1"


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def compiled_sources() -> dict[str, ast.Module]:
    return {path: ast.parse((ROOT / path).read_text()) for path in setup.compiled_paths()}


def test_this_run_runs_the_build_it_asked_for() -> None:
    """Under ``make test-compiled`` every module setup.py compiles is loaded as an extension;
    under ``make test`` none is, whatever was built into the tree."""
    compiled, total = build.compiled_modules()
    if EXPECT_COMPILED:
        assert sorted(compiled) == sorted(module_name(p) for p in setup.compiled_paths())
        assert build.build_kind() == "compiled"
        assert (
            build.describe()
            == f"compiled with mypyc, {len(compiled)} of {total} request-path modules"
        )
    else:
        assert compiled == []
        assert build.build_kind() == "python"
        assert build.describe() == "pure Python"
    assert total > len(setup.compiled_paths())  # the __init__s and LEFT_AS_PYTHON stay Python


def test_the_runtime_looks_where_setup_compiles() -> None:
    assert (
        tuple(layer.replace("/", ".") for layer in setup.COMPILED_LAYERS) == build.COMPILED_PACKAGES
    )
    for path in setup.LEFT_AS_PYTHON:
        assert (ROOT / path).is_file(), path
        assert path.startswith(setup.COMPILED_LAYERS), path


def test_no_compiled_module_raises_from() -> None:
    """mypyc drops the cause of ``raise error from exc``: compiled modules write
    ``raise caused(error, exc)``, which keeps it in both builds."""
    found = [
        f"{path}:{node.lineno}"
        for path, tree in compiled_sources().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Raise) and node.cause is not None
    ]
    assert found == []


def test_no_compiled_class_answers_from_getattr() -> None:
    """A compiled class's declared attributes never fall back to ``__getattr__`` (an unset one
    raises AttributeError): such a class is left as Python (setup.LEFT_AS_PYTHON)."""
    found = [
        f"{path}:{item.lineno}"
        for path, tree in compiled_sources().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name == "__getattr__"
    ]
    assert found == []


def test_caused_is_raise_from() -> None:
    inner = OSError("inner")
    error = caused(ValueError("outer"), inner)
    assert error.__cause__ is inner
    assert error.__suppress_context__  # as `raise ... from exc` leaves it
    alone = caused(ValueError("alone"), None)
    assert alone.__cause__ is None
    assert alone.__suppress_context__  # as `from None`: the error it replaced is not shown


def test_a_compiled_check_keeps_its_cause() -> None:
    """The request checks (compiled in a compiled build) raise their 400 from the JSON error."""
    policy = TokenPolicy(max_prompt_tokens=64, max_completion_tokens=16)
    with pytest.raises(RequestError) as caught:
        check_request(b'{"model": "m", "prompt": ', "completions", policy)
    assert isinstance(caught.value.__cause__, json.JSONDecodeError)
