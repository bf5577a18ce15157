"""The completion-length estimator: the mean length per band, and a running stream's growth."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.admission.estimator import CompletionEstimator, EstimatorConfig, band_of


@pytest.mark.parametrize(
    ("max_tokens", "band"),
    [
        pytest.param(1, 1, id="one"),
        pytest.param(100, 128, id="hundred"),
        pytest.param(128, 128, id="power-of-two"),
        pytest.param(129, 256, id="just-over"),
    ],
)
def test_band_of(max_tokens: int, band: int) -> None:
    """Bands are the next power of two."""
    assert band_of(max_tokens) == band


def test_worst_case_until_enough_samples() -> None:
    """Below min_samples the estimate and the growth are the worst case; from then on learned."""
    est = CompletionEstimator(EstimatorConfig(min_samples=10))
    for length in range(1, 10):
        est.observe("default", 500, length * 10)
    assert est.expected("default", 500) == 500
    assert est.growth("default", 500, 0) == 500
    assert not est.learned()
    est.observe("default", 500, 100)
    assert est.learned()
    assert est.expected("default", 500) == 55  # mean of 10, 20, ..., 100
    assert est.growth("default", 500, 0) == 55


@pytest.mark.parametrize(
    ("produced", "growth"),
    [
        pytest.param(0, 214, id="new-mean-of-all"),
        pytest.param(15, 250, id="past-10-mean-of-four-less-15"),
        pytest.param(40, 465, id="past-30-mean-of-50-and-960-less-40"),
        pytest.param(100, 860, id="past-50-only-960-is-longer"),
        pytest.param(970, 30, id="outlived-every-sample-worst-case"),
    ],
)
def test_growth_follows_the_tail(produced: int, growth: int) -> None:
    """Heavy tail: the further a stream has got, the more it is expected to grow still."""
    est = CompletionEstimator(EstimatorConfig(min_samples=1))
    for length in (10, 20, 30, 50, 960):
        est.observe("default", 1000, length)
    assert est.growth("default", 1000, produced) == growth


def test_estimate_capped_at_the_requests_own_max_tokens() -> None:
    """A band holds 65..128; a request of 100 tokens is never expected past its own 100."""
    est = CompletionEstimator(EstimatorConfig(min_samples=1))
    est.observe("default", 128, 128)
    assert est.expected("default", 100) == 100
    assert est.growth("default", 100, 90) == 10


def test_compartments_learn_apart() -> None:
    """Each compartment has its own window."""
    est = CompletionEstimator(EstimatorConfig(min_samples=1))
    est.observe("gold", 120, 7)
    assert est.expected("gold", 120) == 7
    assert est.expected("silver", 120) == 120


def test_window_forgets_old_lengths() -> None:
    """Only the last ``window`` lengths count."""
    est = CompletionEstimator(EstimatorConfig(min_samples=2, window=4))
    for length in (500, 500, 500, 500, 10, 10, 10, 10):
        est.observe("default", 500, length)
    assert est.expected("default", 500) == 10
    assert est.samples("default", 500) == 4


@given(
    lengths=st.lists(st.integers(-5, 2000), min_size=1, max_size=60),
    max_tokens=st.integers(1, 1024),
    produced=st.integers(0, 1100),
)
def test_growth_is_within_bounds(lengths: list[int], max_tokens: int, produced: int) -> None:
    """Growth is never negative and never takes a stream past its max_tokens."""
    est = CompletionEstimator(EstimatorConfig(min_samples=1))
    for length in lengths:
        est.observe("default", max_tokens, length)
    growth = est.growth("default", max_tokens, produced)
    assert 0 <= growth <= max(0, max_tokens - produced)
    assert 0 <= est.expected("default", max_tokens) <= max_tokens
