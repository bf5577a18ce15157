"""The overload manager: each reading's level (pure), and the actions each level takes on the
port, driven by readings handed in by hand, as Envoy's tests drive a fake resource monitor."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from structlog.testing import capture_logs

from sidecar.edge.overload import (
    SHED_PER_TICK,
    Level,
    OverloadManager,
    OverloadThresholds,
    Reading,
    level_of,
)

MIB = 1 << 20
MEMORY = OverloadThresholds(memory_bytes=100 * MIB, stop_accepting=0.9, shed=0.95)
BOTH = OverloadThresholds(memory_bytes=100 * MIB, loop_lag_s=0.5)


def test_shedding_goes_on_until_under_the_first_share() -> None:
    """Once shedding, a reading between the two shares sheds still; under the first, normal."""
    assert level_of(reading(92), MEMORY, "shed") == "shed"
    assert level_of(reading(92), MEMORY, "stop_accepting") == "stop_accepting"
    assert level_of(reading(89), MEMORY, "shed") == "normal"


@pytest.mark.parametrize(
    ("thresholds", "rss_mib", "lag_s", "level"),
    [
        pytest.param(MEMORY, 89, 0.0, "normal", id="under-stop"),
        pytest.param(MEMORY, 90, 0.0, "stop_accepting", id="at-stop"),
        pytest.param(MEMORY, 94, 9.0, "stop_accepting", id="lag-not-watched"),
        pytest.param(MEMORY, 95, 0.0, "shed", id="at-shed"),
        pytest.param(BOTH, 10, 0.5, "stop_accepting", id="lag-at-its-threshold"),
        pytest.param(BOTH, 10, 0.49, "normal", id="lag-under"),
        pytest.param(BOTH, 96, 0.0, "shed", id="memory-wins"),
        pytest.param(OverloadThresholds(), 10_000, 60.0, "normal", id="nothing-watched"),
    ],
)
def test_each_reading_has_its_level(
    thresholds: OverloadThresholds, rss_mib: int, lag_s: float, level: Level
) -> None:
    """Memory against its two shares, lag against its one; unwatched resources never count."""
    assert level_of(Reading(rss_bytes=rss_mib * MIB, loop_lag_s=lag_s), thresholds) == level


@dataclass
class FakePort:
    accepting: bool = True
    asked: int = 0

    shares: list[float] = field(default_factory=list)

    def shed(self, share: float, at_least: int) -> int:
        self.asked += at_least
        self.shares.append(round(share, 3))
        return 5


def reading(rss_mib: int) -> Reading:
    return Reading(rss_bytes=rss_mib * MIB, loop_lag_s=0.0)


def test_levels_act_on_the_port_and_say_so_once() -> None:
    """Past the first share: stop accepting, and shed the share memory is over it; past the
    second, at least a tick's worth, every tick; accept again once the reading falls; each
    change of level is logged once."""
    port = FakePort()
    trims: list[None] = []
    manager = OverloadManager(MEMORY, port, trim=lambda: trims.append(None))
    with capture_logs() as logs:
        manager.update(reading(91))
        assert (port.accepting, port.asked, port.shares) == (False, 0, [0.011])
        manager.update(reading(96))
        manager.update(reading(92))  # still shedding, until under the first share
        assert (port.accepting, port.asked, manager.shed_total) == (False, 2 * SHED_PER_TICK, 15)
        # What memory is over the first share, as a share of what is in use: 1/91, 6/96, 2/92.
        assert port.shares == [0.011, 0.062, 0.022]
        manager.update(reading(50))
        assert port.accepting
    assert len(trims) == 1  # the heap given back on the first tick past normal (then 1 in 10)
    assert [(e["event"], e["overload"]) for e in logs] == [
        ("overload_level", "stop_accepting"),
        ("overload_level", "shed"),
        ("overload_level", "normal"),
    ]
