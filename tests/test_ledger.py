"""The live ledger: a stream is charged its expected footprint until it outgrows it."""

from __future__ import annotations

from sidecar.core.ledger import Ledger, StreamUsage


def usage(**changes: int) -> StreamUsage:
    fields = {"prompt_tokens": 100, "max_tokens": 500, "expected_tokens": 60, "block_size": 16}
    return StreamUsage("default", **(fields | changes))


def test_charge_is_expected_until_outgrown() -> None:
    """100 + 60 = 160 tokens (10 blocks); at 200 relayed, 100 + 200 = 300 -> 304 (19 blocks)."""
    stream = usage()
    assert stream.charge() == 160
    stream.relayed = 200
    assert stream.charge() == 304
    stream.relayed = 900  # never above the worst case: 100 + 500 = 600 -> 608
    assert stream.charge() == stream.worst() == 608


def test_sequences_multiply() -> None:
    """n=2: two sequences of (100 + 60) -> 2 x 160; 50 relayed events are 25 tokens each."""
    stream = usage(sequences=2)
    assert stream.charge() == 320
    stream.relayed = 50
    assert stream.occupancy() == 250
    assert stream.completion_tokens() == 25


def test_ledger_reports_growth_once() -> None:
    """grown() names a stream whose charge rose, once per rise; occupancy is prompts + relayed."""
    ledger = Ledger()
    first, second = usage(), usage(prompt_tokens=10, block_size=1)
    ledger.open(1, first, first.charge())
    ledger.open(2, second, second.charge())
    assert ledger.grown() == []
    second.relayed = 70
    assert ledger.grown() == [(2, 80)]
    assert ledger.grown() == []
    assert (ledger.occupancy(), ledger.reserved(), len(ledger.streams)) == (180, 240, 2)
    assert ledger.close(2) is second
    assert ledger.reserved() == 160
