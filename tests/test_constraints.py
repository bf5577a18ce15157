"""constraints.txt pins every package the project's venv installs (`make`, CI): a fresh machine
gets the versions CI ran, not whatever PyPI has that day."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).parent.parent
# name==version, and an environment marker where the requirement has one
PIN = r"^([A-Za-z0-9_.-]+)==([^\s;]+)(?: ; .+)?$"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins() -> dict[str, str]:
    text = (ROOT / "constraints.txt").read_text()
    found = re.findall(PIN, text, re.MULTILINE)
    return {canonicalize_name(name): version for name, version in found}


@pytest.mark.parametrize(
    "group",
    [
        pytest.param("dependencies", id="runtime"),
        pytest.param("dev", id="dev"),
        pytest.param("demo", id="demo"),
    ],
)
def test_every_requirement_is_pinned_where_its_specifier_allows(group: str) -> None:
    """Each requirement of the group has one exact pin that satisfies it: `make lock` if not."""
    lines = PROJECT[group] if group == "dependencies" else PROJECT["optional-dependencies"][group]
    pinned = pins()
    for line in lines:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is not in constraints.txt: run `make lock`"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (name, pinned[name])


def test_only_exact_pins_and_no_extras() -> None:
    """pip takes no extras and no ranges in a constraints file: every line is name==version."""
    text = (ROOT / "constraints.txt").read_text()
    requirements = [line for line in text.splitlines() if line and not line.startswith(" ")]
    requirements = [line for line in requirements if not line.startswith("#")]
    assert requirements
    assert all(re.fullmatch(PIN, line) for line in requirements), requirements
