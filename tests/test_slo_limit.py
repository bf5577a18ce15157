"""The SLO-steered limit: a gradient on latency over objective, and the invariants it keeps."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.laws.slo_limit import (
    LimitEvidence,
    SloLimit,
    SloLimitConfig,
    drain_allowance,
    fits_in_cache,
    quantile,
)

samples = st.lists(st.floats(0, 50, allow_nan=False), max_size=20).map(tuple)
evidence = st.builds(
    LimitEvidence,
    ttft=samples,
    tpot=samples,
    pressed=st.booleans(),
    ttft_judges=st.booleans(),
    demand=st.integers(0, 5000),
)
configs = st.builds(
    SloLimitConfig,
    floor=st.integers(1, 8),
    ceiling=st.integers(8, 500),
    min_samples=st.integers(1, 5),
)


def test_many_fast_tokens_do_not_hide_slow_starts() -> None:
    """Nine TPOT samples well within their objective and three TTFTs at twice theirs: the
    TTFTs' p90 decides, and the limit is cut."""
    law = SloLimit(40)
    assert law.update(LimitEvidence(ttft=(2.0, 2.0, 2.0), tpot=(0.1,) * 9, pressed=True)) == 20


def test_without_an_engine_queue_slow_starts_do_not_cut() -> None:
    """TTFTs at twice their target but nothing waiting at the engine: TPOT alone decides."""
    law = SloLimit(40)
    evidence = LimitEvidence(ttft=(2.0,) * 3, tpot=(0.5,) * 3, pressed=True, ttft_judges=False)
    assert law.update(evidence) == 64


def test_well_within_objectives_and_bound_the_limit_doubles() -> None:
    """Streams at a tenth of their target while requests wait: the largest step up (x2)."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=(0.1, 0.1, 0.1), tpot=(), pressed=True)) == 20


def test_past_the_objectives_the_limit_shrinks_in_proportion() -> None:
    """p90 of samples at 1.0 against an aim of 0.8: the limit x 0.8."""
    law = SloLimit(50)
    assert law.update(LimitEvidence(ttft=(1.0,) * 10, tpot=(), pressed=True)) == 40


def test_after_the_first_cut_growth_is_gentler() -> None:
    """Slow start doubles; once a cut came, the same fast streams grow it by a quarter."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=(0.1,) * 3, tpot=(), pressed=True)) == 20
    assert law.update(LimitEvidence(ttft=(1.6,) * 3, tpot=(), pressed=True)) == 10
    assert law.update(LimitEvidence(ttft=(0.1,) * 3, tpot=(), pressed=True)) == 12


def test_slow_start_reaches_for_the_demand_within_its_reach() -> None:
    """A burst on a fresh pod: healthy streams and 70 requests in flight or waiting on a limit
    of 21 let the limit reach the demand at once (past x2), but never past x4."""
    law = SloLimit(21)
    assert law.update(LimitEvidence(ttft=(0.1,) * 3, tpot=(), pressed=True, demand=70)) == 70
    flood = SloLimit(21)
    assert flood.update(LimitEvidence(ttft=(0.1,) * 3, tpot=(), pressed=True, demand=5000)) == 84


def test_after_the_first_cut_demand_no_longer_pulls() -> None:
    """Once a cut came, the demand does not lift the limit past the gentler gradient."""
    law = SloLimit(40)
    assert law.update(LimitEvidence(ttft=(1.6,) * 3, tpot=(), pressed=True, demand=200)) == 20
    assert law.update(LimitEvidence(ttft=(0.1,) * 3, tpot=(), pressed=True, demand=200)) == 25


def test_a_limit_nobody_presses_against_does_not_grow() -> None:
    """Fast streams but nobody waiting: no reason to grow."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=(0.1,) * 5, tpot=(), pressed=False)) == 10


def test_too_few_samples_wait_for_more() -> None:
    """Two samples (of three needed) change nothing; the third decides, with all three."""
    law = SloLimit(40)
    assert law.update(LimitEvidence(ttft=(2.0,), tpot=(2.0,), pressed=True)) == 40
    assert law.update(LimitEvidence(ttft=(2.0,), tpot=(), pressed=True)) == 20


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([3.0], 0.9, 3.0, id="one"),
        pytest.param([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 0.9, 9.0, id="p90-of-10"),
        pytest.param([5.0, 1.0], 0.5, 1.0, id="median-of-two"),
    ],
)
def test_quantile_is_the_nearest_rank(values: list[float], q: float, expected: float) -> None:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    assert quantile(values, q) == expected


@given(config=configs, start=st.integers(0, 1000), steps=st.lists(evidence, max_size=40))
def test_the_limit_stays_within_its_bounds(
    config: SloLimitConfig, start: int, steps: list[LimitEvidence]
) -> None:
    """Whatever the evidence, floor <= limit <= ceiling."""
    law = SloLimit(start, config)
    assert config.floor <= law.limit <= config.ceiling
    for step in steps:
        assert config.floor <= law.update(step) <= config.ceiling


@given(config=configs, start=st.integers(1, 500), steps=st.lists(evidence, max_size=40))
def test_one_step_moves_at_most_by_the_gradient_bounds(
    config: SloLimitConfig, start: int, steps: list[LimitEvidence]
) -> None:
    """One update never cuts below min_gradient x the limit, nor grows past the slow start's
    reach x it (max_gradient x it after the first cut), whatever the demand."""
    law = SloLimit(start, config)
    for step in steps:
        before = law.limit
        reach = config.slow_start_reach if law.slow_start else config.max_gradient
        after = law.update(step)
        assert after >= min(before, max(config.floor, int(before * config.min_gradient) - 1))
        # The limit is kept as a fraction and read whole: it is under before + 1.
        assert after <= max((before + 1) * reach, before + 1)


@given(config=configs, start=st.integers(1, 500), steps=st.lists(evidence, max_size=40))
def test_without_pressure_the_limit_never_grows(
    config: SloLimitConfig, start: int, steps: list[LimitEvidence]
) -> None:
    """Nobody waited or was refused: the limit holds or shrinks, never grows."""
    law = SloLimit(start, config)
    for step in steps:
        before = law.limit
        assert law.update(LimitEvidence(ttft=step.ttft, tpot=step.tpot, pressed=False)) <= before


@given(
    start=st.integers(1, 400),
    missed=st.lists(st.floats(0.81, 50), min_size=3, max_size=20).map(tuple),
)
def test_streams_past_their_aim_never_grow_it(start: int, missed: tuple[float, ...]) -> None:
    """Every sample past the aim (0.8 of target): the limit does not grow, however pressed."""
    law = SloLimit(start)
    assert law.update(LimitEvidence(ttft=missed, tpot=(), pressed=True)) <= max(1, start)


@given(
    start=st.integers(1, 400),
    met=st.lists(st.floats(0, 0.79), min_size=3, max_size=20).map(tuple),
)
def test_streams_within_their_aim_and_pressed_always_grow_it(
    start: int, met: tuple[float, ...]
) -> None:
    """Every sample within the aim while requests wait: the limit grows by at least one."""
    law = SloLimit(start)
    assert law.update(LimitEvidence(ttft=met, tpot=met, pressed=True)) >= start + 1


@pytest.mark.parametrize(
    ("running", "kv_usage", "fits"),
    [
        (10, 0.4, 25),
        (23, 1.0, 23),
        (10, 0.01, None),
        (None, 0.5, None),
        (0, 0.5, None),
        (10, None, None),
        (10, 1.5, None),
    ],
)
def test_what_the_cache_holds_at_the_present_mix(
    running: float | None, kv_usage: float | None, fits: int | None
) -> None:
    assert fits_in_cache(running, kv_usage) == fits


def test_slow_start_never_reaches_past_the_cache_but_never_shrinks_for_it() -> None:
    law = SloLimit(30)
    fast = LimitEvidence(ttft=(0.1,) * 3, tpot=(), pressed=True, demand=200, fits=20)
    assert law.update(fast) == 30  # the cache holds 20 at this mix: no growth, and no cut
    law = SloLimit(10)
    assert law.update(replace(fast, fits=25)) == 25


@pytest.mark.parametrize(
    ("held", "ends_per_s", "allowed"),
    [
        pytest.param(23, 1.0, 23, id="one-end-a-second-frees-no-whole-request-in-0.8s"),
        pytest.param(23, 2.5, 25, id="two-and-a-half-a-second-free-two"),
        pytest.param(6, 0.0, 6, id="nothing-ends-no-waiter"),
        pytest.param(0, 0.0, 1, id="an-idle-engine-is-never-shut"),
        pytest.param(10, float("inf"), 10, id="a-pace-that-is-no-number-counts-as-none"),
        pytest.param(10, -3.0, 10, id="a-negative-pace-counts-as-none"),
    ],
)
def test_a_full_cache_allows_what_it_holds_and_what_ends_free_in_time(
    held: int, ends_per_s: float, allowed: int
) -> None:
    """At 0.8 s of wait (the engine's share of a 2 s objective, at the aim): Little's law."""
    assert drain_allowance(held, ends_per_s, 0.8) == allowed


@given(st.integers(0, 10_000), st.floats(0, 1_000), st.floats(0, 60))
def test_the_allowance_never_goes_below_what_the_cache_holds(
    held: int, ends_per_s: float, wait_s: float
) -> None:
    allowed = drain_allowance(held, ends_per_s, wait_s)
    assert allowed >= max(1, held)
    assert allowed <= max(1, held + ends_per_s * wait_s)


def quiet(now: float, start: int | None = None, demand: int = 0) -> LimitEvidence:
    """A tick where nobody pressed against the limit and nothing was sampled."""
    return LimitEvidence(ttft=(), pressed=False, demand=demand, now=now, start=start)


def test_a_quiet_spell_restarts_slow_start_from_the_start() -> None:
    """A limit cut to 10 by a burst, then nobody pressing for restart_after_s: slow start again,
    from where a fresh pod starts (40), as TCP validates a window only by its use."""
    law = SloLimit(20)
    assert law.update(LimitEvidence(ttft=(1.6,) * 3, pressed=True, now=0.0, start=40)) == 10
    assert not law.slow_start
    for second in range(1, 6):
        assert law.update(quiet(float(second), start=40)) == 10
    assert law.update(quiet(6.0, start=40)) == 40
    assert law.slow_start


def test_a_burst_after_a_quiet_spell_is_let_in_at_once() -> None:
    """After the restart, a burst of 96 whose first tokens are healthy gets the demand in one
    step (slow start's reach), not 1.25x a tick."""
    law = SloLimit(20)
    law.update(LimitEvidence(ttft=(1.6,) * 3, pressed=True, now=0.0, start=20))
    for second in range(1, 7):
        law.update(quiet(float(second), start=20))
    healthy = LimitEvidence(ttft=(0.2,) * 3, pressed=True, demand=96, now=7.0, start=20)
    assert law.update(healthy) == 80  # 4 x 20: slow start's reach


def test_light_use_is_quiet_but_pressure_is_not() -> None:
    """Three streams under a limit of 40 are quiet; a tick that pressed starts the count again."""
    law = SloLimit(20)
    law.update(LimitEvidence(ttft=(1.6,) * 3, pressed=True, now=0.0))
    for second in range(1, 5):
        law.update(quiet(float(second), demand=3))
    law.update(LimitEvidence(ttft=(), pressed=True, demand=12, now=5.0))
    for second in range(6, 10):
        law.update(quiet(float(second), demand=3))
    assert not law.slow_start  # 4 s quiet since the press: not yet
    law.update(quiet(11.0, demand=3))
    assert law.slow_start


def test_half_the_limit_in_use_is_not_quiet() -> None:
    """A limit of 10 with 6 in flight and nobody waiting is in use, not idle: no restart."""
    law = SloLimit(20)
    law.update(LimitEvidence(ttft=(1.6,) * 3, pressed=True, now=0.0))
    for second in range(1, 30):
        law.update(quiet(float(second), start=40, demand=6))
    assert (law.limit, law.slow_start) == (10, False)


@given(config=configs, start=st.integers(1, 500), fresh=st.integers(0, 1000), gap=st.floats(0, 60))
def test_a_restart_never_lowers_the_limit(
    config: SloLimitConfig, start: int, fresh: int, gap: float
) -> None:
    """Whatever the start a fresh pod would take, a restart only raises the limit, within its
    bounds."""
    law = SloLimit(start, config)
    law.update(quiet(0.0, start=fresh))
    before = law.limit
    after = law.update(quiet(gap, start=fresh))
    assert before <= after <= config.ceiling


@pytest.mark.parametrize(
    ("tpot", "expected"),
    [
        pytest.param(0.4, 25, id="well-within-grows"),
        pytest.param(0.9, 20, id="between-aim-and-objective-holds"),
        pytest.param(1.0, 20, id="on-the-objective-holds"),
        pytest.param(1.25, 16, id="past-the-objective-cuts-back-to-it"),
    ],
)
def test_time_per_token_cuts_only_past_its_objective(tpot: float, expected: int) -> None:
    """TPOT's p90 below the aim grows a pressed limit, between the aim and the objective holds
    it, past the objective cuts it by objective / p90 (20 x 1 / 1.25 = 16)."""
    law = SloLimit(20)
    law.slow_start = False
    evidence = LimitEvidence(ttft=(), tpot=(tpot,) * 3, pressed=True, ttft_judges=False)
    assert law.update(evidence) == expected
