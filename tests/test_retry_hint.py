"""The retry hint: from the observed release rate and the queue ahead, clamped."""

from __future__ import annotations

import pytest

from sidecar.core.retry_hint import HintBounds, ReleaseRate


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
