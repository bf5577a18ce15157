"""The scale-out signal hears streams while they run: a first token when it is relayed, a long
stream's pace before it ends, each stream once; and its floor from the streams run lightest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import pytest
from prometheus_client import CollectorRegistry, Counter

from sidecar.core.request.objectives import Objectives
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.live.sources import Readings
from sidecar.telemetry.saturation_metrics import SaturationSignal
from tests.declared import NOTHING_DECLARED

if TYPE_CHECKING:
    from sidecar.limiter.events import BulkheadSnapshot

TICK = Readings(declared=NOTHING_DECLARED)


@dataclass
class Pod:
    """A signal (objectives 2 s and 100 ms) over a bulkhead the test sets (``in_use``,
    ``queued``), read on a clock the test sets (``now``)."""

    now: float = 0.0
    in_use: int = 1
    queued: int = 0
    signal: SaturationSignal = field(init=False)

    def __post_init__(self) -> None:
        registry = CollectorRegistry()
        self.signal = SaturationSignal(
            lambda: cast("BulkheadSnapshot", self),
            Counter("sidecar_requests", "r", ["outcome"], registry=registry),
            lambda: self.now,
            objectives=Objectives(ttft_s=2.0, tpot_s=0.1),
        )

    def start(self, arrived: float = 0.0) -> StreamTiming:
        timing = StreamTiming(sent=arrived)
        self.signal.track(timing, arrived)
        return timing

    def run(self, arrived: float, ttft_s: float, tpot_s: float, tokens: int) -> None:
        """A stream relayed from start to completion: its clock moves with it."""
        timing = self.start(arrived)
        for i in range(tokens):
            timing.saw(1, arrived + ttft_s + i * tpot_s)
        self.now = arrived + ttft_s + (tokens - 1) * tpot_s
        self.signal.streamed(timing, arrived, completed=True)


def test_a_first_token_reaches_the_signal_when_it_is_relayed() -> None:
    """A stream that arrived at 0 gets its first token at 1.2 s (0.6 of 2 s) and runs for a
    minute: the next tick reads 0.6, not a minute later."""
    pod = Pod()
    timing = pod.start()
    timing.saw(1, 1.2)
    pod.now = 1.5
    pod.signal.observe(TICK)
    assert pod.signal.read().ttft == pytest.approx(0.6)


def test_a_stream_counts_its_ttft_once() -> None:
    """Nine streams' first tokens sampled while they ran, then the streams end: still nine
    samples (no floor: the term is their 0.3); counted twice, eighteen would make 0.3 the
    floor and the term 0."""
    pod = Pod()
    timings = [pod.start() for _ in range(9)]
    for timing in timings:
        timing.saw(1, 0.6)
        timing.saw(1, 0.7)
    pod.now = 1.0
    pod.signal.observe(TICK)
    for timing in timings:
        pod.signal.streamed(timing, 0.0, completed=True)
    assert pod.signal.read().ttft == pytest.approx(0.3)


def test_a_long_streams_pace_reaches_the_signal_while_it_runs() -> None:
    """A stream at 50 ms a token (0.5 of 100 ms) counts from its 32nd token: it reads 0.5 while
    it runs; once it completed, its final pace reads the same, counted once."""
    pod = Pod()
    timing = pod.start()
    for i in range(31):
        timing.saw(1, 0.2 + 0.05 * i)
    pod.now = 0.2 + 0.05 * 30
    assert pod.signal.read().tpot == 0.0
    pod.now = 0.2 + 0.05 * 31
    timing.saw(1, pod.now)
    assert pod.signal.read().tpot == pytest.approx(0.5)
    pod.signal.streamed(timing, 0.0, completed=True)
    assert pod.signal.read().tpot == pytest.approx(0.5)


def test_a_stalled_stream_counts_its_stall() -> None:
    """Forty tokens at 20 ms from 1 s, then nothing: at 5 s its next token could at best make
    100 ms a token, and the term reads 1 before it resumes."""
    pod = Pod()
    timing = pod.start()
    for i in range(40):
        timing.saw(1, 1.0 + 0.02 * i)
    pod.now = 1.8
    assert pod.signal.read().tpot == pytest.approx(0.2)
    pod.now = 5.0
    assert pod.signal.read().tpot == pytest.approx(1.0)


def test_a_stream_left_by_its_client_leaves_no_pace() -> None:
    """Its pace counted while it ran; once the client left, it is gone (the client set it)."""
    pod = Pod()
    timing = pod.start()
    for i in range(40):
        timing.saw(1, 0.4 + 0.1 * i)
    pod.now = 4.3
    assert pod.signal.read().tpot == pytest.approx(1.0)
    pod.signal.streamed(timing, 0.0, completed=False)
    assert pod.signal.read().tpot == 0.0


def test_a_stream_waiting_for_its_first_token_past_its_objective_reads_past_one() -> None:
    """Admitted at once, no token after 3 s against a 2 s objective: ttft reads 1.5 now."""
    pod = Pod()
    pod.start()
    pod.now = 1.5
    assert pod.signal.read().ttft == 0.0
    pod.now = 3.0
    assert pod.signal.read().ttft == pytest.approx(1.5)


def test_the_floor_is_what_streams_run_alone_showed() -> None:
    """Ten streams alone at 30 ms a token (0.3), then twenty with 20 running at 65 ms (0.65):
    the tpot term reads (0.65 - 0.3) / 0.7 = 0.5, half of capacity."""
    pod = Pod(in_use=1)
    for n in range(10):
        pod.run(arrived=10.0 * n, ttft_s=0.2, tpot_s=0.03, tokens=50)
    pod.in_use = 20
    for n in range(20):
        pod.run(arrived=200.0 + n / 10, ttft_s=0.2, tpot_s=0.065, tokens=50)
    assert pod.signal.read().tpot == pytest.approx(0.5)


def test_a_stream_that_ran_beside_many_is_not_a_light_sample() -> None:
    """Nine streams alone at 0.1 (too few for a floor), then ten that began alone but ran
    while 30 others did (seen at a tick), at 0.3: those ten are tagged 30, so the floor is
    theirs and the term 0; tagged alone, the floor would be 0.1 and the term 0.22."""
    pod = Pod(in_use=1)
    for n in range(9):
        pod.run(arrived=10.0 * n, ttft_s=0.2, tpot_s=0.01, tokens=10)
    timings = [pod.start(arrived=100.0) for _ in range(10)]
    for timing in timings:
        for i in range(10):
            timing.saw(1, 100.2 + 0.03 * i)
    pod.in_use, pod.now = 30, 100.5
    pod.signal.observe(TICK)
    pod.in_use = 1
    for timing in timings:
        pod.signal.streamed(timing, 100.0, completed=True)
    assert pod.signal.read().tpot == 0.0
