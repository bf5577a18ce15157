"""The completion-length estimator: a nearest-rank quantile per band, never above max_tokens."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.estimator import CompletionEstimator, EstimatorConfig, band_of


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
    """Below min_samples the estimate is max_tokens; from then on the learned quantile."""
    est = CompletionEstimator(EstimatorConfig(quantile=0.9, min_samples=10))
    for length in range(1, 10):
        est.observe("default", 500, length * 10)
    assert est.expected("default", 500) == 500
    est.observe("default", 500, 100)
    # lengths 10..100 step 10: the 9th of 10 (nearest rank ceil(0.9 x 10) = 9) is 90
    assert est.expected("default", 500) == 90


def test_bands_and_compartments_learn_apart() -> None:
    """A short band's lengths say nothing about a long band, nor one tenant's about another's."""
    est = CompletionEstimator(EstimatorConfig(min_samples=1))
    est.observe("gold", 100, 7)
    assert est.expected("gold", 120) == 7
    assert est.expected("gold", 1000) == 1000
    assert est.expected("silver", 100) == 100


def test_estimate_capped_at_the_requests_own_max_tokens() -> None:
    """A band learned at 500 tokens prices a 300-token request at 300 at most."""
    est = CompletionEstimator(EstimatorConfig(quantile=1.0, min_samples=1))
    est.observe("default", 500, 480)
    assert est.expected("default", 300) == 300


def test_window_forgets_old_lengths() -> None:
    """Only the last ``window`` lengths count, so the estimate follows drift."""
    est = CompletionEstimator(EstimatorConfig(quantile=1.0, min_samples=2, window=4))
    for length in (400, 400, 10, 10, 10, 10):
        est.observe("default", 512, length)
    assert est.expected("default", 512) == 10


@given(
    lengths=st.lists(st.integers(-5, 5000), min_size=1, max_size=80),
    max_tokens=st.integers(1, 4096),
    quantile=st.floats(0.01, 1.0),
)
def test_estimate_is_within_bounds(lengths: list[int], max_tokens: int, quantile: float) -> None:
    """Whatever was observed, the estimate lies in [0, max_tokens] and is an observed value."""
    est = CompletionEstimator(EstimatorConfig(quantile=quantile, min_samples=1))
    for length in lengths:
        est.observe("default", max_tokens, length)
    got = est.expected("default", max_tokens)
    assert 0 <= got <= max_tokens
    assert got in {min(max(0, x), max_tokens) for x in lengths}


@given(lengths=st.lists(st.integers(0, 1000), min_size=1, max_size=60))
def test_higher_quantile_never_lower(lengths: list[int]) -> None:
    """The estimate is monotone in the quantile."""
    low = CompletionEstimator(EstimatorConfig(quantile=0.5, min_samples=1))
    high = CompletionEstimator(EstimatorConfig(quantile=0.95, min_samples=1))
    for length in lengths:
        low.observe("default", 1000, length)
        high.observe("default", 1000, length)
    assert low.expected("default", 1000) <= high.expected("default", 1000)
