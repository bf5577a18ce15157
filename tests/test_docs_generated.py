"""docs/settings.md and docs/metrics.md are what the code generates: a new setting or metric
without `make docs` fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import gen_docs
from scripts.gen_docs import DOCS, main, pages
from sidecar.entry.settings_reference import setting_rows


def test_generated_pages_match_the_code() -> None:
    """Each generated page, as committed, equals what scripts/gen_docs.py writes now."""
    for path, expected in pages().items():
        committed = path.read_text(encoding="utf-8") if path.exists() else ""
        assert committed == expected, (
            f"{path.relative_to(DOCS.parent)} is out of date: run `make docs`"
        )


def test_settings_page_lists_every_setting() -> None:
    """Every SIDECAR_* variable has its row in docs/settings.md."""
    page = (DOCS / "settings.md").read_text(encoding="utf-8")
    missing = [row.env for row in setting_rows() if f"| `{row.env}` |" not in page]
    assert missing == []


def test_check_mode_reports_a_stale_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--check` exits 1 naming the stale page and saying `run make docs`; it writes nothing."""
    page = tmp_path / "docs" / "settings.md"
    page.parent.mkdir()
    page.write_text("old\n", encoding="utf-8")
    monkeypatch.setattr(gen_docs, "DOCS", page.parent)
    monkeypatch.setattr(gen_docs, "pages", lambda: {page: "new\n"})
    assert main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "out of date: docs/settings.md" in out
    assert "run `make docs`" in out
    assert page.read_text(encoding="utf-8") == "old\n"
