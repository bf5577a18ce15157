"""The `sidecar` command's own help: commands, version, every setting, every preset."""

from __future__ import annotations

from importlib import metadata

import pytest

import sidecar
from sidecar.core.model.model_spec import load_model_spec, preset_names
from sidecar.core.model.preset_ids import HUB_IDS
from sidecar.entry.cli import COMMANDS, main, version
from sidecar.entry.settings import Settings
from sidecar.entry.settings_reference import setting_rows


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str | None, str]:
    """Exit status and everything printed, however the command ends."""
    try:
        status: int | str | None = main(argv)
    except SystemExit as exited:
        status = exited.code
    captured = capsys.readouterr()
    return status, captured.out + captured.err


@pytest.mark.parametrize(
    ("argv", "statuses"),
    [
        pytest.param([], {2}, id="bare"),
        pytest.param(["--help"], {0}, id="help"),
    ],
)
def test_top_level_lists_every_command(
    argv: list[str], statuses: set[int], capsys: pytest.CaptureFixture[str]
) -> None:
    """Bare `sidecar` and `sidecar --help` both show each command with its one line."""
    status, text = _run(argv, capsys)
    assert status in statuses
    for name, (_, line) in COMMANDS.items():
        assert f"{name}  " in text
        assert line in text


def test_version_is_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    """`sidecar --version` prints the version pip installed."""
    status, text = _run(["--version"], capsys)
    assert status == 0
    assert text.strip() == f"sidecar {metadata.version('gpu-admission-sidecar')}"


def test_version_without_the_distribution_is_the_package_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run from a source tree that pip never installed, the version is sidecar.__version__."""

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert version() == sidecar.__version__


def test_serve_help_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    """`sidecar serve --help` names each SIDECAR_* setting with its type, default and meaning."""
    status, text = _run(["serve", "--help"], capsys)
    assert status == 0
    lines = text.splitlines()
    for row in setting_rows():
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(row.env + " "))
        assert f"({row.type}; default {row.default})" in lines[at]
        assert lines[at + 1].strip() == row.description
    for group in ("network:", "capacity:", "admission:", "logs:"):
        assert f"  {group}" in lines


def test_every_setting_has_a_description() -> None:
    """A setting nobody described would show an empty line in the help and the docs."""
    undescribed = [name for name, field in Settings.model_fields.items() if not field.description]
    assert undescribed == []


@pytest.mark.parametrize(
    ("env", "kind", "default"),
    [
        pytest.param("SIDECAR_PORT", "int in [0, 65535]", "8080", id="bounded-int"),
        pytest.param("SIDECAR_OVERHEAD", "size", "2GiB", id="size"),
        pytest.param("SIDECAR_WEIGHTS", "size or auto", "unset", id="size-or-word"),
        pytest.param("SIDECAR_SAFETY_FACTOR", "float in (0, 1]", "0.8", id="open-interval"),
        pytest.param("SIDECAR_REJECT_MODE", "sse|http", "sse", id="choice"),
        pytest.param("SIDECAR_SHADOW", "bool", "false", id="bool"),
    ],
)
def test_setting_rows_show_type_and_default(env: str, kind: str, default: str) -> None:
    """Types read as a user writes values (sizes, ranges, choices), defaults as they type them."""
    row = next(r for r in setting_rows() if r.env == env)
    assert (row.type, row.default) == (kind, default)


def test_plan_help_lists_presets_and_their_hub_ids(capsys: pytest.CaptureFixture[str]) -> None:
    """`sidecar plan --help` shows every preset and the Hugging Face ids it answers to."""
    status, text = _run(["plan", "--help"], capsys)
    assert status == 0
    for name in preset_names():
        assert f"  {name} " in text
        for hub_id in HUB_IDS.get(name, ()):
            assert hub_id in text


@pytest.mark.parametrize(
    ("preset", "hub_id"),
    [
        pytest.param(preset, hub_id, id=hub_id)
        for preset, ids in sorted(HUB_IDS.items())
        for hub_id in ids
    ],
)
def test_each_listed_hub_id_loads_its_preset(preset: str, hub_id: str) -> None:
    """What the help promises holds: `--model <hub id>` loads that preset."""
    assert load_model_spec(hub_id).name == preset


def test_every_preset_has_hub_ids() -> None:
    """A preset added without its Hugging Face ids would be missing from the help's table."""
    assert sorted(HUB_IDS) == preset_names()


def test_missing_model_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """`sidecar plan` without --model says which flag is missing, exit 2."""
    status, text = _run(["plan", "--vram", "24GiB", "--weights", "15GB"], capsys)
    assert status == 2
    assert "the following arguments are required: --model" in text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            ["plan", "--vram", "24GiB"],
            "sidecar plan: error: the following arguments are required: --model "
            "(see `sidecar plan --help`)",
            id="plan-missing-model",
        ),
        pytest.param(
            ["plan", "--model", "qwen2.5-7b", "--tp", "two"],
            "sidecar plan: error: argument --tp: invalid int value: 'two' "
            "(see `sidecar plan --help`)",
            id="plan-bad-int",
        ),
        pytest.param(
            ["serve", "extra"],
            "sidecar: error: unrecognized arguments: extra (see `sidecar --help`)",
            id="serve-extra-argument",
        ),
        pytest.param(
            ["frobnicate"],
            "sidecar: error: argument COMMAND: invalid choice: 'frobnicate' "
            "(choose from 'plan', 'serve', 'probe') (see `sidecar --help`)",
            id="unknown-command",
        ),
    ],
)
def test_a_usage_error_is_one_line(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad flags print one line on stderr, naming the help to read, exit 2."""
    status, text = _run(argv, capsys)
    assert status == 2
    assert text.strip().splitlines() == [expected]


def test_plan_help_says_ids_are_looked_up_locally(capsys: pytest.CaptureFixture[str]) -> None:
    """The help tells where a Hugging Face id is looked for, and that the network is not."""
    status, text = _run(["plan", "--help"], capsys)
    assert status == 0
    assert "looked up in the local cache first (HF_HUB_CACHE, HF_HOME," in text
    assert "never on the network" in text
