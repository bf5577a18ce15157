"""When places free: the forecast from the ages of those held and how long places are held."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.admission.frees_forecast import CacheGrowth, FreesForecast, draw, remaining_s

HOLDS = [10.0, 20.0, 30.0, 40.0]


def test_holders_that_started_together_free_their_places_at_the_holds_quantiles() -> None:
    """Four streams started at once, holds of 10-13 s: one place frees at each of the holds,
    not all four at the mean, nor the first at once; the next at 20 s, held again from 10."""
    forecast = FreesForecast([0.0] * 4, [10.0, 11.0, 12.0, 13.0], limit=100)
    assert [forecast.at(i) for i in range(5)] == [10.0, 11.0, 12.0, 13.0, 20.0]


def test_a_holder_that_outlived_the_short_holds_ends_among_the_longer_ones() -> None:
    """A stream 25 s old ends at 30 or 40 s (5 or 15 s from now), never at 10 or 20."""
    assert {remaining_s(25.0, q / 10, HOLDS) for q in range(10)} == {5.0, 15.0}


def test_a_holder_older_than_every_hold_seen_ends_within_the_median() -> None:
    assert 0.0 <= remaining_s(99.0, 0.99, HOLDS) <= 30.0


def test_a_freed_place_is_held_again_by_whoever_takes_it() -> None:
    """One place held 10 s each time: it frees at 10, 20 and 30 s from now."""
    forecast = FreesForecast([0.0], [10.0], limit=100)
    assert [forecast.at(i) for i in range(3)] == [10.0, 20.0, 30.0]
    assert forecast.within(25.0) == 2


def test_nothing_held_frees_nothing_and_the_forecast_stops_at_its_limit() -> None:
    assert FreesForecast([], HOLDS, limit=100).at(0) is None
    forecast = FreesForecast([0.0], [1.0], limit=3)
    assert forecast.at(2) == 3.0
    assert forecast.at(3) is None
    assert forecast.within(1e9) == 3
    with pytest.raises(ValueError, match="at least one hold"):
        FreesForecast([0.0], [], limit=3)


@given(
    st.lists(st.floats(0, 100), max_size=40),
    st.lists(st.floats(0.01, 100), min_size=1, max_size=40),
)
def test_places_free_in_order_and_never_before_now(ages: list[float], holds: list[float]) -> None:
    forecast = FreesForecast(ages, sorted(holds), limit=200)
    frees = [forecast.at(i) for i in range(2 * len(ages))]
    known = [f for f in frees if f is not None]
    assert known == sorted(known)
    assert all(f >= 0 for f in known)
    assert len(known) == (2 * len(ages) if ages else 0)


@given(st.integers(1, 10**6), st.integers(2, 200))
def test_the_draws_spread_evenly_over_any_run(start: int, count: int) -> None:
    """Any run of n consecutive draws leaves no gap in (0, 1) wider than 3 / n (the golden
    ratio's three-gap spread): holders that started together draw the whole spread of holds."""
    points = sorted([0.0, *(draw(i) for i in range(start, start + count)), 1.0])
    assert max(b - a for a, b in itertools.pairwise(points)) < 3 / count


def test_a_place_frees_where_the_cache_takes_one_more_not_where_a_holder_ends() -> None:
    """Four streams of 200 tokens that started together grow 10 tokens a second in a pool of
    1,000; two draw the 10 s hold, two the 30 s. At 10 s each holds 300: the first to end leaves
    900 for three (one more would not fit), the second 600 for two, and one caller gets in.
    Counted at the ends alone, both places free at 10 s."""
    ages, holds = [0.0] * 4, [10.0, 30.0]
    assert [FreesForecast(ages, holds, limit=10).at(i) for i in range(2)] == [10.0, 10.0]
    cache = CacheGrowth(pool_tokens=1000, used_tokens=800, prompt_tokens=200, tokens_per_s=10)
    forecast = FreesForecast(ages, holds, limit=10, cache=cache)
    first, second = forecast.at(0), forecast.at(1)
    assert first == 10.0
    assert second is not None
    assert second > 10.0


def test_places_the_cache_holds_now_are_free_at_once_up_to_the_places() -> None:
    """Four holders of 100 tokens in a pool of 1,000 and six places: two more are free now, the
    third waits for an end; with only the four places, none is free now."""
    cache = CacheGrowth(pool_tokens=1000, used_tokens=400, prompt_tokens=100, tokens_per_s=1)
    growing = FreesForecast([0.0] * 4, HOLDS, limit=10, cache=cache, places=6)
    assert (growing.at(0), growing.at(1)) == (0.0, 0.0)
    third = growing.at(2)
    assert third is not None
    assert third > 0.0
    held = FreesForecast([0.0] * 4, HOLDS, limit=10, cache=cache)
    assert held.at(0) == min(HOLDS)


@given(
    st.lists(st.floats(0, 100), max_size=40),
    st.lists(st.floats(0.01, 100), min_size=1, max_size=40),
    st.builds(
        CacheGrowth,
        pool_tokens=st.floats(1, 1e6),
        used_tokens=st.floats(0, 1e6),
        prompt_tokens=st.floats(1, 1e4),
        tokens_per_s=st.floats(0, 1e3),
    ),
)
def test_a_cache_model_frees_places_in_order_and_never_before_now(
    ages: list[float], holds: list[float], cache: CacheGrowth
) -> None:
    forecast = FreesForecast(ages, sorted(holds), limit=200, cache=cache)
    known = [f for i in range(2 * len(ages)) if (f := forecast.at(i)) is not None]
    assert known == sorted(known)
    assert all(f >= 0 for f in known)


def test_a_cache_read_before_the_burst_does_not_empty_it() -> None:
    """The engine's KV use was read on an idle pod (0 tokens), a tick before four 200-token
    requests came: the forecast counts their prompts all the same, as it does where the
    reading says so."""
    holds = [10.0, 30.0]
    stale = CacheGrowth(pool_tokens=1000, used_tokens=0, prompt_tokens=200, tokens_per_s=10)
    read = CacheGrowth(pool_tokens=1000, used_tokens=800, prompt_tokens=200, tokens_per_s=10)
    assert [FreesForecast([0.0] * 4, holds, limit=10, cache=stale).at(i) for i in range(3)] == [
        FreesForecast([0.0] * 4, holds, limit=10, cache=read).at(i) for i in range(3)
    ]
