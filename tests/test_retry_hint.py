"""The retry hint: from the observed release rate and the queue ahead, clamped."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.admission.retry_hint import (
    MAX_RETRY_S,
    HintBounds,
    ReleaseRate,
    Returns,
    spread_s,
)


def feed(times: list[float]) -> ReleaseRate:
    rate = ReleaseRate()
    for at in times:
        rate.observe(at)
    return rate


@pytest.mark.parametrize(
    ("times", "ahead", "now", "expected"),
    [
        pytest.param([0.0, 0.5, 1.0, 1.5, 2.0], 0, None, 0.5, id="2-per-s-nobody-ahead"),
        pytest.param([0.0, 0.5, 1.0, 1.5, 2.0], 5, None, 3.0, id="2-per-s-5-ahead"),
        pytest.param([0.0, 1.0, 2.0], 3, None, 4.0, id="1-per-s-3-ahead"),
        pytest.param([0.0, 1.0, 2.0], 3, 8.0, 16.0, id="releases-stopped-rate-decays"),
        pytest.param([0.0, 0.1], 10_000, None, 60.0, id="clamped-high"),
        pytest.param([0.0, 0.001], 0, None, 0.5, id="clamped-low"),
        pytest.param([], 3, None, 1.0, id="no-data-unknown"),
        pytest.param([5.0], 3, 6.0, 1.0, id="one-release-unknown"),
        pytest.param([1.0, 1.0], 3, None, 1.0, id="same-instant-unknown"),
    ],
)
def test_retry_after(times: list[float], ahead: int, now: float | None, expected: float) -> None:
    """(ahead + 1) / releases-per-second, within [0.5, 60]; 1 s while the rate is unknown."""
    assert feed(times).retry_after_s(ahead, now) == pytest.approx(expected)


def test_window_forgets_old_releases() -> None:
    """Only the last `window` releases count: a recent burst is not diluted by old history."""
    rate = ReleaseRate(window=3)
    for at in (0.0, 100.0, 100.5, 101.0):
        rate.observe(at)
    assert rate.rate_per_s() == pytest.approx(2.0)


def test_bounds_are_configurable() -> None:
    """Custom bounds clamp the hint."""
    rate = ReleaseRate(bounds=HintBounds(low_s=2.0, high_s=5.0, unknown_s=3.0))
    assert rate.retry_after_s(0) == 3.0
    for at in (0.0, 0.1, 0.2):
        rate.observe(at)
    assert rate.retry_after_s(0) == 2.0
    assert rate.retry_after_s(1000) == 5.0


def test_window_must_hold_two() -> None:
    """A window of one release cannot measure a rate."""
    with pytest.raises(ValueError, match="at least 2"):
        ReleaseRate(window=1)


def steady_then_quiet(quiet_s: float, held: bool) -> tuple[ReleaseRate, float]:
    """Two releases a second for 32 s, then ``quiet_s`` without a release, with permits held
    (a stall) or none (an idle pod); returns the rate and the moment a burst finds it."""
    rate = ReleaseRate()
    rate.busy(0.0)
    for i in range(1, 65):
        rate.observe(i * 0.5)
    if held:
        return rate, 32.0 + quiet_s
    rate.idle(32.0)
    rate.busy(32.0 + quiet_s)  # the burst's first request is held
    return rate, 32.0 + quiet_s


@pytest.mark.parametrize(
    ("quiet_s", "held", "expected"),
    [
        pytest.param(60.0, False, 2.5, id="a-minute-idle-then-a-burst"),
        pytest.param(3600.0, False, 2.5, id="an-hour-idle-then-a-burst"),
        pytest.param(60.0, True, 5 / (63 / 91.5), id="a-minute-held-without-a-release"),
    ],
)
def test_idle_time_does_not_dilute_the_rate(quiet_s: float, held: bool, expected: float) -> None:
    """Four ahead at two releases a second: back in (4 + 1) / 2 = 2.5 s, however long the pod
    sat idle before the burst; a stall (permits held, none released) still lengthens it."""
    rate, now = steady_then_quiet(quiet_s, held)
    assert rate.retry_after_s(4, now) == pytest.approx(expected)


# --- spreading a burst's returns --------------------------------------------------------------


@pytest.mark.parametrize(
    ("first_s", "place", "per_s", "draw", "expected"),
    [
        pytest.param(0.5, 0, 2.0, 0.0, 0.5, id="first-refused"),
        pytest.param(0.5, 1, 2.0, 0.0, 1.0, id="second-a-release-later"),
        pytest.param(0.5, 83, 2.0, 0.0, 42.0, id="84th-of-a-burst"),
        pytest.param(0.5, 3, 2.0, 0.5, 2.25, id="jitter-half-a-release"),
        pytest.param(1.5, 2, 4.0, 0.0, 2.0, id="behind-a-queue"),
    ],
)
def test_a_place_among_the_refused_is_priced(
    first_s: float, place: int, per_s: float, draw: float, expected: float
) -> None:
    """first + (place + draw) / releases per second: the n-th refused caller comes back when
    capacity for it frees."""
    assert spread_s(first_s, place, per_s, draw) == pytest.approx(expected)


def feed_busy(draw: float = 0.0) -> ReleaseRate:
    """Two releases a second (0.0 .. 2.0), and jitter drawn as ``draw``."""
    rate = ReleaseRate(draw=lambda: draw)
    for at in (0.0, 0.5, 1.0, 1.5, 2.0):
        rate.observe(at)
    return rate


def test_a_burst_of_refusals_is_spread_one_release_apart() -> None:
    """Ten refused at the same instant, nobody queued: 0.5, 1.0, ... 5.0 s, at 2 releases/s
    measured; a measured rate spreads them past the horizon that bounds a guessed one."""
    rate = feed_busy()
    quotes = [rate.quote(0, 2.0) for _ in range(10)]
    assert quotes == pytest.approx([0.5 * (n + 1) for n in range(10)])


@pytest.mark.parametrize(
    ("first_s", "place", "per_s", "horizon_s", "expected"),
    [
        pytest.param(0.5, 7, 2.0, 4.0, 4.0, id="last-place-of-the-lap"),
        pytest.param(0.5, 8, 2.0, 4.0, 0.5, id="next-lap-starts-at-the-first"),
        pytest.param(0.5, 19, 2.0, 4.0, 2.0, id="third-lap-fourth-place"),
        pytest.param(1.0, 3, 0.1, 4.0, 1.0, id="a-release-longer-than-the-horizon"),
        pytest.param(0.5, 8, 2.0, math.inf, 4.5, id="no-horizon"),
    ],
)
def test_places_past_the_horizon_start_a_new_lap(
    first_s: float, place: int, per_s: float, horizon_s: float, expected: float
) -> None:
    """A lap holds the places that the horizon's releases take; the next starts from the first
    again, so the spread ends at the horizon instead of where the whole burst would be served."""
    assert spread_s(first_s, place, per_s, 0.0, horizon_s) == pytest.approx(expected)


def test_a_fresh_burst_past_a_lap_returns_spread_over_the_horizon() -> None:
    """48 refused at once on a fresh pod, 4 running: the guess (4 a second) makes laps of 16
    places a quarter second apart; nobody is told past 1 s + 4 s, and each release interval gets
    the laps' share of the burst, 3 (no herd)."""
    rate = ReleaseRate(draw=lambda: 0.5)
    quotes = [rate.quote(0, 0.0, running=4) for _ in range(48)]
    assert max(quotes) == pytest.approx(1.0 + 15.5 / 4)
    per_interval = Counter(math.floor(q * 4) for q in quotes)
    assert sorted(per_interval) == list(range(4, 20))
    assert set(per_interval.values()) == {3}


def test_a_fast_engines_places_spread_above_the_floor() -> None:
    """16 releases a second: the first place is held to the 0.5 s floor and the next ones follow
    a sixteenth of a second apart, instead of all being told the floor together."""
    rate = ReleaseRate(draw=lambda: 0.0)
    for n in range(17):
        rate.observe(n / 16)
    assert [rate.quote(0, 1.0) for _ in range(4)] == pytest.approx([0.5, 0.5625, 0.625, 0.6875])


def test_the_refused_count_decays_as_they_come_back() -> None:
    """Each refused caller counts until the time it was told: after it, a new refusal is placed
    as if it came first again."""
    rate = feed_busy()
    assert [rate.quote(0, 2.0) for _ in range(3)] == pytest.approx([0.5, 1.0, 1.5])
    # At 3.01 s the first two came back, one is still due: second place. The rate measured up
    # to now has fallen meanwhile (4 releases over 3.01 s).
    assert rate.quote(0, 3.01) == pytest.approx(2 * 3.01 / 4)
    assert rate.quote(0, 10.0) == pytest.approx(10.0 / 4)  # all came back: first place


def test_quotes_are_capped() -> None:
    """However many are refused, none is told to wait past MAX_RETRY_S."""
    rate = feed_busy(draw=0.99)
    quotes = [rate.quote(5, 2.0) for _ in range(500)]
    assert max(quotes) == MAX_RETRY_S


def test_a_guessed_rate_quotes_nobody_past_the_horizon() -> None:
    """500 refused on a fresh pod, 10 running and 5 queued: the first is told 1 s and no quote
    is more than the 4 s horizon after it (the guess alone would reach 1 + 500 / 15 = 34 s)."""
    rate = ReleaseRate(draw=lambda: 0.99)
    quotes = [rate.quote(5, 0.0, running=10) for _ in range(500)]
    assert min(quotes) == pytest.approx(1.0 + 0.99 / 15)
    assert max(quotes) <= 1.0 + 4.0


def test_an_unknown_rate_spreads_over_what_runs() -> None:
    """No release yet: the first is told the one-second default, and the 4 running are taken
    to end within it, a quarter second apart."""
    rate = ReleaseRate(draw=lambda: 0.0)
    assert [rate.quote(0, 0.0, running=4) for _ in range(3)] == [1.0, 1.25, 1.5]


def test_an_unknown_rate_takes_the_queue_to_end_with_what_runs() -> None:
    """No release yet, 4 running and 2 queued: all six are taken to be done within the default
    second, so the first refused is told 1 s (not 1 s more for the queue) and the next follow a
    sixth of a second apart: a fresh pod's limit is still growing, and a caller told late
    leaves it unpressed."""
    rate = ReleaseRate(draw=lambda: 0.0)
    assert [rate.quote(2, 0.0, running=4) for _ in range(3)] == pytest.approx(
        [1.0, 1.0 + 1 / 6, 1.0 + 2 / 6]
    )


def test_the_window_of_refusals_is_bounded() -> None:
    """Beyond max_size refusals still due, the place stops growing."""
    returns = Returns(max_size=3)
    for due in (5.0, 6.0, 7.0, 8.0):
        returns.told(due)
    assert returns.ahead(0.0) == 3
    assert returns.ahead(6.0) == 1


@given(
    first_s=st.floats(0.0, 30.0),
    per_s=st.floats(0.01, 1000.0),
    place=st.integers(0, 10_000),
    draws=st.tuples(st.floats(0.0, 0.999), st.floats(0.0, 0.999)),
)
def test_quotes_are_monotone_in_place(
    first_s: float, per_s: float, place: int, draws: tuple[float, float]
) -> None:
    """A later place is never quoted less: before jitter, and even across draws (a place's
    jitter stays within its own release interval)."""
    assert spread_s(first_s, place + 1, per_s, 0.0) >= spread_s(first_s, place, per_s, 0.0)
    assert spread_s(first_s, place + 1, per_s, draws[1]) >= spread_s(
        first_s, place, per_s, draws[0]
    )


@given(
    ahead=st.integers(0, 50),
    refusals=st.integers(1, 200),
    draw=st.floats(0.0, 0.999),
    step=st.floats(0.0, 2.0),
)
def test_every_quote_is_within_the_bounds(
    ahead: int, refusals: int, draw: float, step: float
) -> None:
    """Whatever the queue, the burst and the jitter: 0.5 s <= quote <= MAX_RETRY_S."""
    rate = feed_busy(draw)
    quotes = [rate.quote(ahead, 2.0 + n * step) for n in range(refusals)]
    assert all(0.5 <= q <= MAX_RETRY_S for q in quotes)


@given(
    first_s=st.floats(0.0, 30.0),
    per_s=st.floats(0.01, 1000.0),
    place=st.integers(0, 10_000),
    draw=st.floats(0.0, 0.999),
    horizon_s=st.floats(0.1, 60.0),
)
def test_every_place_is_within_the_horizon(
    first_s: float, per_s: float, place: int, draw: float, horizon_s: float
) -> None:
    """Whatever the burst: no place is quoted more than the horizon (or one release, where that
    is longer) after the first."""
    quote = spread_s(first_s, place, per_s, draw, horizon_s)
    assert first_s <= quote <= first_s + max(horizon_s, 1 / per_s) + 1e-9


def test_how_long_a_place_is_held_weighs_what_was_served_against_the_engine() -> None:
    """The engine's mean stands in for the served requests short of 16; past 16 they alone
    say; neither: unknown."""
    rate = ReleaseRate()
    assert rate.hold_s() is None
    rate.expect_hold(30.0)
    assert rate.hold_s() == pytest.approx(30.0)
    for _ in range(4):
        rate.held(10.0)  # a burst's first ends are its shortest streams
    assert rate.hold_s() == pytest.approx((4 * 10.0 + 12 * 30.0) / 16)
    for _ in range(12):
        rate.held(20.0)
    assert rate.hold_s() == pytest.approx((4 * 10.0 + 12 * 20.0) / 16)
    rate.expect_hold(None)
    assert rate.hold_s() == pytest.approx((4 * 10.0 + 12 * 20.0) / 16)


def test_the_pace_is_the_places_over_how_long_one_is_held() -> None:
    """Little's law: 31 places held 31 s each free one a second; nothing held frees nothing."""
    rate = ReleaseRate()
    rate.expect_hold(31.0)
    assert rate.pace_per_s(31) == pytest.approx(1.0)
    assert rate.pace_per_s(0) is None
    assert ReleaseRate().pace_per_s(31) is None


def test_a_burst_onto_long_streams_is_told_to_come_back_a_release_apart() -> None:
    """31 streams of about 31 s fill the pod: the refused are told to come back one second
    apart (the pace at which places free), whatever the burst's first fast grants measured
    (the limit growing, 30 a second), and past the 60 s bound the places start again from the
    first rather than all being told 60 s."""
    rate = ReleaseRate(draw=lambda: 0.0)
    for index in range(31):
        rate.observe(index / 30)  # slow start's grants: 30 a second
    rate.expect_hold(31.0)
    quotes = [rate.quote(0, 1.0, running=31, slots=31) for _ in range(65)]
    assert quotes[:3] == pytest.approx([1.0, 2.0, 3.0])
    assert quotes[59] == pytest.approx(MAX_RETRY_S) == max(quotes)
    assert quotes[60:62] == pytest.approx([1.0, 2.0])  # the second lap


def test_the_pace_counts_the_places_the_pod_runs_when_full() -> None:
    """A pod still growing toward 40 places with 10 held is told the pace of the 40."""
    rate = ReleaseRate(draw=lambda: 0.0)
    rate.expect_hold(20.0)
    assert rate.quote(0, 0.0, running=10, slots=40) == pytest.approx(20.0 / 40)


def test_a_token_drain_is_not_priced_by_the_pace() -> None:
    """Where tokens must drain (adaptive), the measured drain decides, not the places' pace."""
    rate = feed_busy()
    rate.expect_hold(100.0)
    assert rate.quote(0, 2.0, tokens=10, running=5) == feed_busy().quote(
        0, 2.0, tokens=10, running=5
    )


def test_places_freed_while_full_are_counted_on_a_clock_that_runs_only_then() -> None:
    """Four places freed a second apart while the pod was full, with a minute not full between
    two of them: one a second, not four over a minute; fewer than four say nothing."""
    rate = ReleaseRate()
    rate.full(0.0, True)
    for at in (1.0, 2.0):
        rate.freed(at)
    rate.full(2.0, False)
    rate.freed(30.0)  # not full: not counted
    assert rate.frees_per_s(30.0) is None
    rate.full(62.0, True)
    for at in (63.0, 64.0):
        rate.freed(at)
    assert rate.frees_per_s(64.0) == pytest.approx(1.0)
    # Still full and nothing freed since: the rate falls as the time goes by.
    assert rate.frees_per_s(67.0) == pytest.approx(3 / 6)


def test_the_slower_of_the_pace_and_the_places_freed_prices_a_place() -> None:
    """The requests served so far say 31 places free twice a second (the burst's short streams
    ended first); while full, one a second freed: callers are told one second apart."""
    rate = ReleaseRate(draw=lambda: 0.0)
    rate.expect_hold(15.5)
    rate.full(0.0, True)
    for at in (10.0, 11.0, 12.0, 13.0, 14.0):
        rate.freed(at)
    assert rate.quote(0, 14.0, running=31, slots=31) == pytest.approx(1.0)
    assert rate.quote(0, 14.0, running=31, slots=31) == pytest.approx(2.0)


def burst_of(rate: ReleaseRate, holders: int, at: float = 0.0) -> None:
    """``holders`` streams take their places at ``at`` (tickets 0..holders-1)."""
    for ticket in range(holders):
        rate.holding(ticket, at)


def test_a_full_pods_refused_callers_are_told_when_the_holders_are_forecast_to_end() -> None:
    """31 streams of 13-50 s started together (the engine's quantiles say so), 31 callers
    refused: each is told a later place, the first when the shortest stream can end (not
    Little's 1 s apart from the first second on), the last within the longest."""
    rate = ReleaseRate(draw=lambda: 0.0)
    rate.expect_hold(31.5, tuple(13 + 37 * (i + 0.5) / 16 for i in range(16)))
    burst_of(rate, 31)
    quotes = [rate.quote(0, 0.5, running=31, slots=31, full=True) for _ in range(31)]
    assert quotes == sorted(quotes)
    assert quotes[0] >= 13.0
    assert quotes[-1] <= 50.0
    assert len(set(quotes)) >= 16  # spread over the streams' ends, not all told one time


def test_places_the_forecast_sees_free_past_the_longest_hint_are_told_it() -> None:
    """One place held 20 s a time: it frees at 20, 40, 60 and 80 s. The first refused caller is
    told 40 s (a place of margin); the next ones are owed places past the 60 s cap and are told
    54-60 s (the cap, jittered), not the first places again, which others are owed."""
    draws = iter([0.0, 0.0, 0.5, 1.0])
    rate = ReleaseRate(draw=lambda: next(draws))
    rate.expect_hold(20.0, (20.0,))
    burst_of(rate, 1)
    quotes = [rate.quote(0, 0.0, full=True) for _ in range(4)]
    assert quotes == pytest.approx([40.0, 60.0, 57.0, 54.0])


def test_the_forecast_follows_the_holders_and_the_holds_served() -> None:
    """A waiter's place frees when a holder is forecast to end: at once for a pod whose
    streams are near their end, never while nothing is held or nothing says how long."""
    rate = ReleaseRate()
    burst_of(rate, 2)
    assert rate.forecast_wait_s(0, 1.0) is None  # nothing says how long places are held
    rate.expect_hold(20.0, (20.0,))
    assert rate.forecast_wait_s(0, 1.0) == pytest.approx(19.0)
    assert rate.forecast_wait_s(0, 19.5) == pytest.approx(0.5)
    for ticket in range(2):
        rate.ended(ticket, 20.0, served=True)
    assert rate.forecast_wait_s(0, 21.0) is None  # nothing held
    rate.holding(7, 21.0)
    for _ in range(16):
        rate.held(4.0)  # 16 served here outweigh the engine's 20 s
    assert rate.forecast_wait_s(0, 22.0) == pytest.approx(3.0)


def test_a_request_cut_short_is_not_a_hold() -> None:
    """Only requests that ran to their end say how long a place is held."""
    rate = ReleaseRate()
    rate.holding(1, 0.0)
    rate.ended(1, 0.1, served=False)
    assert rate.hold_s() is None
    rate.holding(2, 0.0)
    rate.ended(2, 3.0, served=True)
    assert rate.hold_s() == pytest.approx(3.0)
