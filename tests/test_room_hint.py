"""The edge's room hint: the measured pace of frees, else how long nothing has gone, in [1, 60]."""

from __future__ import annotations

import pytest

from sidecar.core.admission.room_hint import RoomHint


@pytest.mark.parametrize(
    ("frees", "now", "expected"),
    [
        pytest.param([], 0.2, 1.0, id="just-made-floor-1s"),
        pytest.param([], 25.0, 25.0, id="nothing-gone-since-made"),
        pytest.param([], 500.0, 60.0, id="capped-at-60"),
        pytest.param([10.0], 35.0, 30.0, id="one-free-in-the-window"),
        pytest.param([float(t) for t in range(40, 70, 2)], 70.0, 2.0, id="one-every-2s"),
        pytest.param([float(t) for t in range(5, 10)], 10.0, 2.0, id="young-resource-own-life"),
        pytest.param([5.0], 100.0, 60.0, id="old-free-pruned-full-since"),
        pytest.param([1.0 + i / 1000 for i in range(5000)], 7.0, 1.0, id="busy-floor"),
    ],
)
def test_wait(frees: list[float], now: float, expected: float) -> None:
    """Each case's quote from its frees, for a resource made at t=0."""
    hint = RoomHint(0.0)
    for t in frees:
        hint.freed(t)
    assert hint.wait_s(now) == pytest.approx(expected)


def test_memory_is_bounded_by_the_window() -> None:
    """A million frees over 100 s keep at most the window's seconds."""
    hint = RoomHint(0.0)
    for i in range(1_000_000):
        hint.freed(i / 10_000)
    assert len(hint._seconds) <= 31
