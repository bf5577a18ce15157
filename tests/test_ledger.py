"""The live ledger: a stream is charged what it holds plus the growth still expected of it."""

from __future__ import annotations

from collections.abc import Callable

from sidecar.core.admission.ledger import Ledger, StreamUsage


def flat(tokens: int) -> Callable[[int], int]:
    """A growth that expects ``tokens`` more, whatever was produced."""
    return lambda _produced: tokens


def usage(growth: Callable[[int], int] | None = None, **changes: int) -> StreamUsage:
    fields = {"prompt_tokens": 100, "max_tokens": 500, "block_size": 16}
    return StreamUsage(compartment="default", growth=growth or flat(60), **(fields | changes))


def test_charge_is_held_plus_expected_growth() -> None:
    """100 + 0 + 60 = 160 (10 blocks); at 200 relayed, 100 + 200 + 60 = 360 (23 blocks = 368)."""
    stream = usage()
    assert stream.charge() == 160
    stream.relayed = 200
    assert stream.charge() == 368
    stream.relayed = 900  # never above the worst case: 100 + 500 = 600 -> 608
    assert stream.charge() == stream.worst() == 608


def test_no_growth_known_is_the_worst_case() -> None:
    """Without a learned growth (an engine that does not preempt) the charge is the worst case."""
    stream = StreamUsage(compartment="default", prompt_tokens=100, max_tokens=500, block_size=16)
    assert stream.charge() == stream.worst() == 608


def test_growth_is_asked_with_what_was_produced() -> None:
    """The growth function hears the tokens produced per sequence."""
    heard: list[int] = []

    def growth(produced: int) -> int:
        heard.append(produced)
        return 0

    stream = usage(growth=growth, sequences=2)
    stream.relayed = 50
    stream.charge()
    assert heard == [25]


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
    first, second = usage(), usage(prompt_tokens=10, block_size=1, growth=flat(0))
    ledger.open(1, first, first.charge())
    ledger.open(2, second, second.charge())
    assert ledger.grown() == []
    second.relayed = 70
    assert ledger.grown() == [(2, 80)]
    assert ledger.grown() == []
    assert (ledger.occupancy(), ledger.reserved(), len(ledger.streams)) == (180, 240, 2)
    assert ledger.close(2) is second
    assert ledger.reserved() == 160
