"""Every relative link in README.md and docs/**/*.md reaches a file (and a heading, when it names
one), and each index (docs/README.md, docs/lab/README.md) lists every page of its folder and
nothing else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(text: str) -> str:
    """The text a reader sees as prose: fenced blocks and inline code removed."""
    return CODE.sub("", FENCE.sub("", text))


def relative_links(text: str) -> list[str]:
    """Targets of inline links and images that point inside the repository."""
    targets = [match.group(1) for match in LINK.finditer(prose(text))]
    return [target for target in targets if not SCHEME.match(target)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(heading) for heading in HEADING.findall(FENCE.sub("", path.read_text()))}


def broken(page: Path) -> list[str]:
    """The links of one page that reach no file, or no heading of the file they name."""
    found = []
    for target in relative_links(page.read_text(encoding="utf-8")):
        file_part, _, anchor = target.partition("#")
        path = (page.parent / file_part).resolve() if file_part else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            found.append(target)
    return found


@pytest.mark.parametrize(
    "page", [pytest.param(p, id=p.relative_to(ROOT).as_posix()) for p in PAGES]
)
def test_every_relative_link_resolves(page: Path) -> None:
    """A renamed or removed page, or a renamed heading, fails here, not in a reader's browser."""
    assert broken(page) == []


def listed_pages(index: Path) -> set[Path]:
    """The pages of the index's own folder that the index links (not those above or below)."""
    targets = (target.partition("#")[0] for target in relative_links(index.read_text("utf-8")))
    paths = {(index.parent / target).resolve() for target in targets if target.endswith(".md")}
    return {path for path in paths if path.parent == index.parent}


@pytest.mark.parametrize(
    "folder", [pytest.param(DOCS, id="docs"), pytest.param(DOCS / "lab", id="docs/lab")]
)
def test_the_index_lists_exactly_the_pages_that_exist(folder: Path) -> None:
    """The folder's README.md links every page beside it and no page that is not there."""
    index = folder / "README.md"
    linked = listed_pages(index)
    pages = {path.resolve() for path in folder.glob("*.md") if path != index}
    assert sorted(p.name for p in pages - linked) == []
    assert sorted(p.name for p in linked - pages) == []


def test_an_unlisted_page_is_reported(tmp_path: Path) -> None:
    """A page the index forgets, and one it names but that is gone, are both seen."""
    (tmp_path / "README.md").write_text("[a](a.md) [gone](gone.md) [up](../x.md)\n")
    (tmp_path / "a.md").write_text("# A\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert {p.name for p in listed_pages(tmp_path / "README.md")} == {"a.md", "gone.md"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("see [a](a.md) and [b](b.md#part)", ["a.md", "b.md#part"], id="inline"),
        pytest.param("![pic](demo.png)", ["demo.png"], id="image"),
        pytest.param("[web](https://example.com) [mail](mailto:x@y)", [], id="absolute-skipped"),
        pytest.param("```\n[code](nowhere.md)\n```\n", [], id="fenced-code-skipped"),
        pytest.param("`[code](nowhere.md)`", [], id="inline-code-skipped"),
    ],
)
def test_links_are_found_where_a_reader_would_click(text: str, expected: list[str]) -> None:
    """The link finder itself: prose links counted, code and absolute URLs left out."""
    assert relative_links(text) == expected


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        pytest.param("On Kubernetes", "on-kubernetes", id="words"),
        pytest.param(
            "The capacity calculator: `sidecar plan`",
            "the-capacity-calculator-sidecar-plan",
            id="code-and-colon",
        ),
        pytest.param("Start-up", "start-up", id="hyphen"),
    ],
)
def test_slug_matches_githubs_anchor(heading: str, expected: str) -> None:
    """Anchors are checked against the slug GitHub gives the heading."""
    assert slug(heading) == expected


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    """A page linking a missing file and a missing heading is caught: the check can fail."""
    (tmp_path / "there.md").write_text("# Real heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#real-heading) [gone](gone.md) [bad](there.md#no-such) [x](gone.md#x)\n"
    )
    assert broken(page) == ["gone.md", "there.md#no-such", "gone.md#x"]
