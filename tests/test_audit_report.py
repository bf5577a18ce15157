"""Issue 48's audit targets, each checked against its own bound, and the table they render."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.audit_report import Measured, markdown, served, table_row, verdicts

CALM = Measured(
    row=2,
    attack="pipelined streamed chats, never read",
    opened=100,
    most=100,
    other=(0.02,) * 20,
    own=(0.02,) * 20,
    baseline_s=0.01,
    rss_peak_mib=80.0,
    ended={"closed": 100},
    engine_requests=200,
)


def missed(m: Measured) -> list[str]:
    return [v.target for v in verdicts(m) if not v.met]


def test_a_row_within_every_target_passes_them_all() -> None:
    """Served everywhere, small, fast, two engine requests a connection: five PASS lines."""
    assert missed(CALM) == []
    assert len(verdicts(CALM)) == 5
    assert table_row(CALM).endswith("| PASS |")


@pytest.mark.parametrize(
    ("changes", "target"),
    [
        pytest.param(
            {"other": (0.02,) * 18 + (None,) * 2}, "legit served, other address", id="other-90"
        ),
        pytest.param({"other": (0.02,) * 19 + (None,)}, None, id="other-at-95"),
        pytest.param({"rss_peak_mib": 80.0}, None, id="unchanged"),
        pytest.param({"own": (0.02,) * 9 + (None,)}, None, id="own-at-90"),
        pytest.param(
            {"own": (0.02,) * 17 + (None,) * 3}, "legit served, attacker's address", id="own-85"
        ),
        pytest.param({"rss_peak_mib": 512.5}, "peak RSS", id="rss-over"),
        pytest.param({"rss_peak_mib": 512.0}, None, id="rss-at-bound"),
        pytest.param({"other": (1.2,) * 20}, "legit added latency", id="slow-legit"),
        pytest.param({"baseline_s": None}, "legit added latency", id="no-baseline"),
        pytest.param(
            {"engine_requests": 201}, "engine requests per attacking connection", id="engine-3rd"
        ),
        pytest.param({"opened": 0}, "engine requests per attacking connection", id="no-connection"),
    ],
)
def test_each_target_misses_past_its_own_bound(
    changes: dict[str, object], target: str | None
) -> None:
    """One measurement moved past (or onto) its bound misses that target alone (or none)."""
    changed = dataclasses.replace(CALM, **changes)  # type: ignore[arg-type]
    assert missed(changed) == ([] if target is None else [target])


def test_other_rows_have_no_engine_target() -> None:
    """Only row 2 counts engine requests: the others have four targets and a dash."""
    row_three = dataclasses.replace(CALM, row=3, engine_requests=None)
    assert [v.target for v in verdicts(row_three)][-1] == "legit added latency"
    assert "| - |" in table_row(row_three)


def test_nothing_sent_counts_as_nothing_served() -> None:
    """An empty probe list is 0 %, not a division error or a pass."""
    assert served(()) == 0.0
    assert missed(dataclasses.replace(CALM, own=()))[0] == "legit served, attacker's address"


def test_the_markdown_lists_a_miss_by_name() -> None:
    """A missed row says MISS and which target, in the table and in its verdict line."""
    text = markdown([dataclasses.replace(CALM, rss_peak_mib=900.0)], "audit")
    assert "| MISS: peak RSS |" in text
    assert "row 2 MISS peak RSS: 900 MiB (target <= 512 MiB)" in text
