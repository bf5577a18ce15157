"""Every measured figure in README.md names the command that produced it, a median comes with its
range, and no page of the docs hard-codes how many tests there are (pytest prints that)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_docs_links import FENCE, PAGES, ROOT

README = ROOT / "README.md"


def makefile_targets() -> frozenset[str]:
    """The targets the Makefile declares: a figure's command must be one a reader can run."""
    match = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    return frozenset(match[1].split()) if match else frozenset()


TARGETS = makefile_targets()
# A measured figure: a throughput, a ratio (1.22x, 17x), a memory size of a process, a median.
MEASURED = re.compile(r"\d[\d,.]*\s?tok/s|\b\d+(?:\.\d+)?x\b|\d\s?MiB RSS|\bmedian\b")
MAKE = re.compile(r"`make ([a-z-]+)[^`]*`")
COMMAND = re.compile(r"`(?:sidecar|python -m|pytest|PYTHONPATH=\S+ python -m pytest) [^`]+`")
# A figure with its range over the repetitions in brackets beside it: 1,431 tok/s (1,360-1,502).
RANGE = re.compile(r"\d[\d,.]*(?:x| tok/s)?\s\(\d[\d,.]*-\d[\d,.]*")
TEST_COUNT = re.compile(r"\b\d[\d,]*\s+(?:tests|passed)\b")


def paragraphs(text: str) -> list[str]:
    """The prose blocks of a page (a table is one block), fenced code left out; a block that
    ends in a colon is read with the one it introduces."""
    blocks: list[str] = []
    for block in re.split(r"\n\s*\n", FENCE.sub("", text)):
        if not block.strip():
            continue
        if blocks and blocks[-1].endswith(":"):
            blocks[-1] += "\n\n" + block.strip()
        else:
            blocks.append(block.strip())
    return blocks


def unsourced(block: str) -> list[str]:
    """What a block with a measured figure lacks: a command anyone can run (a Makefile target or
    a `sidecar` / `python -m` / `pytest` command), and, where it gives a median, a figure with
    its range in brackets."""
    if not MEASURED.search(block):
        return []
    missing = []
    targets = MAKE.findall(block)
    if not (any(t in TARGETS for t in targets) or COMMAND.search(block)):
        missing.append("no command")
    if re.search(r"\bmedian\b", block) and not RANGE.search(block):
        missing.append("a median without a range")
    return missing


def test_every_measured_figure_in_the_readme_names_its_command() -> None:
    """A throughput, a ratio, an RSS or a median in README.md sits in a paragraph (or table) that
    names the command that measured it, and a median is shown with a range."""
    found = {block[:80]: unsourced(block) for block in paragraphs(README.read_text("utf-8"))}
    assert {start: lacks for start, lacks in found.items() if lacks} == {}


@pytest.mark.parametrize(
    ("block", "lacks"),
    [
        pytest.param("SLO goodput 1.22x the cap.", ["no command"], id="ratio-alone"),
        pytest.param("`make bench-overload`: 3,322 tok/s.", [], id="named-target"),
        pytest.param("`make bench-everything`: 3,322 tok/s.", ["no command"], id="unknown-target"),
        pytest.param(
            "`make bench-overload`, the median of three: 1.22x.",
            ["a median without a range"],
            id="median-without-range",
        ),
        pytest.param(
            "`make bench-overload`, the median of three: 1.22x (1.07-1.23).", [], id="median-range"
        ),
        pytest.param(
            "`make bench-overload`, the median of three: 1.22x, raw 0.96-1.12x over the loads.",
            ["a median without a range"],
            id="a-range-of-something-else",
        ),
        pytest.param("`sidecar plan --model x` prints 5.", [], id="no-figure"),
        pytest.param("86-88 MiB RSS (`make soak`)", [], id="rss-with-target"),
    ],
)
def test_a_figure_without_its_command_is_reported(block: str, lacks: list[str]) -> None:
    """The check itself: a figure with no runnable command, or a median with no range, is seen."""
    assert unsourced(block) == lacks


def test_a_block_ending_in_a_colon_is_read_with_the_one_it_introduces() -> None:
    """A sentence that introduces a table is judged with the table: its range counts."""
    text = "`make soak`, the median:\n\n| a | 1.2x (1.1-1.3) |\n\nnext\n"
    assert paragraphs(text) == ["`make soak`, the median:\n\n| a | 1.2x (1.1-1.3) |", "next"]


@pytest.mark.parametrize(
    "page", [pytest.param(p, id=p.relative_to(ROOT).as_posix()) for p in PAGES]
)
def test_no_page_hard_codes_a_test_count(page: Path) -> None:
    """A count of tests in prose goes stale with the next test; captured output (fenced) may show
    one, since it says when and by what command it was printed."""
    prose = FENCE.sub("", page.read_text(encoding="utf-8"))
    assert TEST_COUNT.findall(prose) == []


def test_a_test_count_in_prose_is_reported() -> None:
    """The check itself: "2,409 tests" and "1,834 passed" in prose are found, a fenced one not."""
    text = "The suite has 2,409 tests; 1,834 passed, 3 failed.\n```\n16 passed in 16.14s\n```\n"
    assert TEST_COUNT.findall(FENCE.sub("", text)) == ["2,409 tests", "1,834 passed"]
