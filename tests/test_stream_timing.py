"""A relayed stream's timing: TTFT at the engine and the mean time per output token."""

from __future__ import annotations

import pytest

from sidecar.core.request.stream_timing import StreamTiming


def test_ttft_runs_from_sent_to_the_first_token_event() -> None:
    """The first chunk with token events fixes TTFT; later ones do not move it."""
    timing = StreamTiming(sent=10.0)
    assert timing.ttft_s() is None
    timing.saw(1, 10.4)
    timing.saw(1, 10.5)
    assert timing.ttft_s() == pytest.approx(0.4)


def test_tpot_is_the_mean_gap_after_the_first_token() -> None:
    """Five events over 0.4 s after the first: 0.1 s per output token."""
    timing = StreamTiming(sent=0.0)
    for i in range(5):
        timing.saw(1, 1.0 + 0.1 * i)
    assert timing.tpot_s() == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        pytest.param([], None, id="no-token"),
        pytest.param([(1, 1.0)], None, id="one-token"),
        pytest.param([(0, 1.0), (0, 2.0)], None, id="chunks-without-tokens"),
        pytest.param([(2, 1.0), (2, 1.3)], 0.1, id="several-events-per-chunk"),
    ],
)
def test_tpot_needs_two_token_events(
    chunks: list[tuple[int, float]], expected: float | None
) -> None:
    """TPOT counts every token event relayed; with fewer than two there is no gap to measure."""
    timing = StreamTiming(sent=0.0)
    for tokens, at in chunks:
        timing.saw(tokens, at)
    tpot = timing.tpot_s()
    assert (tpot if tpot is None else round(tpot, 6)) == expected


def test_waiting_for_the_first_token() -> None:
    """A stream still waiting says for how long; once a token came it is no longer waiting."""
    timing = StreamTiming(sent=5.0)
    assert timing.waiting_s(7.0) == pytest.approx(2.0)
    timing.saw(1, 7.5)
    assert timing.waiting_s(8.0) is None


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        pytest.param(1.45, 0.05, id="on-pace"),
        pytest.param(2.0, 0.1, id="stalled-a-second"),
    ],
)
def test_tpot_so_far_counts_a_stall_since_the_last_token(now: float, expected: float) -> None:
    """Ten events 50 ms apart from 1 s: its pace so far is 50 ms a token; stalled until 2 s,
    its next token could at best make 100 ms a token."""
    timing = StreamTiming(sent=0.0)
    for i in range(10):
        timing.saw(1, 1.0 + 0.05 * i)
    assert timing.tpot_so_far_s(now) == pytest.approx(expected)


def test_tpot_so_far_needs_two_token_events() -> None:
    """One token event: no pace yet, however long it waits for the next."""
    timing = StreamTiming(sent=0.0)
    timing.saw(1, 1.0)
    assert timing.tpot_so_far_s(5.0) is None
