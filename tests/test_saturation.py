"""The scale-out signal's arithmetic: each ratio by hand, the largest wins, the windows forget."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest
from prometheus_client import CollectorRegistry, Counter

from sidecar.core.outcomes import EDGE_FAULTS, REJECTIONS
from sidecar.core.saturation import (
    CAPACITY_REFUSALS,
    EngineEvidence,
    EnginePeaks,
    OutcomeWindow,
    SaturationConfig,
    SaturationEvidence,
    engine_ratios,
    saturation,
)
from sidecar.live.probes import EngineReading
from sidecar.live.sources import Readings
from sidecar.telemetry.saturation_metrics import SaturationSignal
from tests.declared import NOTHING_DECLARED

if TYPE_CHECKING:
    from sidecar.limiter.events import BulkheadSnapshot

CONFIG = SaturationConfig(kv_threshold=0.8, queue_threshold=5)


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        pytest.param(EngineEvidence(), (0.0, 0.0), id="engine-says-nothing"),
        pytest.param(EngineEvidence(0.0, 0, 0), (0.0, 0.0), id="idle"),
        # 96 streams at 1 % of the pool, nothing waiting: 0.01 / 0.8.
        pytest.param(EngineEvidence(0.01, 96, 0), (0.0125, 0.0), id="96-streams-pool-untouched"),
        pytest.param(EngineEvidence(0.4, 20, 0), (0.5, 0.0), id="half-the-kv-threshold"),
        # A request or two waits for the next step: below the threshold, not saturation.
        pytest.param(EngineEvidence(0.01, 96, 4), (0.0125, 0.0), id="brief-wait-below-threshold"),
        # 256 running (max_num_seqs) and 64 waiting: (256 + 64) / 256.
        pytest.param(EngineEvidence(0.03, 256, 64), (0.0375, 1.25), id="at-max-num-seqs"),
        pytest.param(EngineEvidence(0.96, 30, 0), (1.2, 0.0), id="kv-past-threshold"),
        pytest.param(EngineEvidence(None, 0, 10), (0.0, 10.0), id="waiting-nothing-running"),
    ],
)
def test_engine_ratios(engine: EngineEvidence, expected: tuple[float, float]) -> None:
    """(kv, engine_queue) of one engine reading, computed by hand."""
    assert engine_ratios(engine, CONFIG) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("evidence", "utilisation", "term"),
    [
        pytest.param(SaturationEvidence(), 0.0, "kv", id="idle-pod"),
        pytest.param(SaturationEvidence(engine_kv=0.45, sidecar_in_flight=96), 0.45, "kv",
                     id="kv-only"),
        # 21 running, 64 waiting for admission: (21 + 64) / 21.
        pytest.param(SaturationEvidence(engine_kv=0.01, sidecar_in_flight=21, sidecar_queued=64),
                     85 / 21, "sidecar_queue", id="queued-at-the-sidecar"),
        pytest.param(SaturationEvidence(sidecar_queued=3), 3.0, "sidecar_queue",
                     id="queued-with-nothing-in-flight"),
        # One refusal in four lately: 1 + 0.25.
        pytest.param(SaturationEvidence(engine_kv=0.2, recent_offered=400, recent_refused=100),
                     1.25, "refusals", id="refusing"),
        pytest.param(SaturationEvidence(recent_offered=10, recent_refused=10), 2.0, "refusals",
                     id="refusing-everything"),
        pytest.param(SaturationEvidence(engine_kv=0.3, engine_queue=1.25), 1.25, "engine_queue",
                     id="waiting-at-the-engine"),
    ],
)  # fmt: skip
def test_the_signal_is_the_largest_ratio(
    evidence: SaturationEvidence, utilisation: float, term: str
) -> None:
    """The utilisation equals its largest term, and that term is the one expected."""
    result = saturation(evidence)
    assert result.utilisation == pytest.approx(utilisation)
    assert getattr(result, term) == pytest.approx(utilisation)


def test_any_refusal_or_wait_reaches_one() -> None:
    """One refusal among many, or one request queued, is enough for 1 or more."""
    assert saturation(SaturationEvidence(recent_offered=1000, recent_refused=1)).utilisation > 1
    assert saturation(SaturationEvidence(sidecar_in_flight=200, sidecar_queued=1)).utilisation > 1


def test_engine_peaks_hold_for_their_window() -> None:
    """A reading's ratios count until hold_s after it, then are forgotten."""
    peaks = EnginePeaks(hold_s=30.0)
    assert peaks.ratios(0.0, CONFIG) == (0.0, 0.0)
    peaks.add(0.0, EngineEvidence(0.08, 100, 30))  # 130 / 100
    peaks.add(10.0, EngineEvidence(0.16, 20, 0))
    assert peaks.ratios(29.0, CONFIG) == pytest.approx((0.2, 1.3))
    assert peaks.ratios(31.0, CONFIG) == pytest.approx((0.2, 0.0))
    assert peaks.ratios(41.0, CONFIG) == (0.0, 0.0)


def test_without_load_only_the_latest_reading_counts() -> None:
    """Nothing runs through the sidecar: the held peaks are not demand, the latest reading is."""
    peaks = EnginePeaks(hold_s=30.0)
    assert peaks.ratios(0.0, CONFIG, hold=False) == (0.0, 0.0)
    peaks.add(0.0, EngineEvidence(0.128, 100, 30))
    peaks.add(1.0, EngineEvidence(0.0, 0, 0))
    assert peaks.ratios(2.0, CONFIG) == pytest.approx((0.16, 1.3))
    assert peaks.ratios(2.0, CONFIG, hold=False) == (0.0, 0.0)


def test_a_queue_between_waves_is_priced_against_what_the_engine_ran() -> None:
    """256 ran (max_num_seqs), then a wave ended: 50 running, 64 waiting. Against 256 that is
    (256 + 64) / 256 at the full reading, and the lull adds nothing larger; against its own 50
    the lull would have read 2.28."""
    peaks = EnginePeaks(hold_s=30.0)
    peaks.add(0.0, EngineEvidence(0.03, 256, 64))
    peaks.add(1.0, EngineEvidence(0.01, 50, 64))
    assert peaks.ratios(2.0, CONFIG)[1] == pytest.approx(320 / 256)


def test_outcome_window_counts_what_ended_lately() -> None:
    """Deltas of cumulative counts inside the window; too_large and draining are not refusals."""
    window = OutcomeWindow(window_s=60.0)
    assert window.recent(0.0, {"completed": 100, "queue_full": 5}) == (0.0, 0.0)
    counts = {"completed": 150, "queue_full": 15, "too_large": 10, "draining": 5,
              "too_many_client_connections": 20}  # fmt: skip
    assert window.recent(30.0, counts) == (95.0, 30.0)
    # Past the window, the sample of 30 s is the base: nothing new ended since.
    assert window.recent(95.0, counts) == (0.0, 0.0)


def test_capacity_refusals_are_known_outcomes() -> None:
    """Every refusal the signal counts is an outcome the sidecar can end a request with, and
    the two that are not for want of capacity stay out."""
    assert set(REJECTIONS) | set(EDGE_FAULTS) >= CAPACITY_REFUSALS
    assert {"too_large", "draining", "header_timeout", "bad_request"}.isdisjoint(CAPACITY_REFUSALS)
    assert {"queue_full", "shed", "no_capacity", "too_many_client_connections"} <= CAPACITY_REFUSALS


def idle_pod() -> tuple[SaturationSignal, Counter, SimpleNamespace]:
    """A signal over an idle bulkhead and a fresh outcome counter, read on a clock the test sets
    (``clock.now``)."""
    registry = CollectorRegistry()
    requests = Counter("sidecar_requests", "r", ["outcome"], registry=registry)
    clock = SimpleNamespace(now=0.0)
    idle = cast("BulkheadSnapshot", SimpleNamespace(in_use=0, queued=0))
    return SaturationSignal(lambda: idle, requests, lambda: clock.now), requests, clock


def test_refusals_leave_the_signal_a_window_after_they_ended_however_rarely_it_is_read() -> None:
    """Ticks sample the outcomes, so refusals read long after they ended no longer count."""
    signal, requests, clock = idle_pod()
    readings = Readings(declared=NOTHING_DECLARED)
    assert signal.read().refusals == 0.0  # read once at start-up, then not for 10 minutes
    requests.labels(outcome="queue_full").inc(10)
    for second in range(1, 601):
        clock.now = float(second)
        signal.observe(readings)
    assert signal.read().utilisation == 0.0


@pytest.mark.parametrize(
    ("read_at", "refusals"),
    [
        pytest.param(29.0, 2.0, id="seen-by-a-scrape-29s-later"),
        pytest.param(32.0, 0.0, id="gone-32s-later"),
    ],
)
def test_a_refusal_counts_for_the_longest_scrape_interval_then_leaves(
    read_at: float, refusals: float
) -> None:
    """Ten refusals half a second in, nothing else ended: a scrape up to 30 s later still reads
    the pod as refusing; two seconds past that window it reads idle again."""
    signal, requests, clock = idle_pod()
    readings = Readings(declared=NOTHING_DECLARED)
    signal.observe(readings)
    requests.labels(outcome="queue_full").inc(10)
    for second in range(1, int(read_at) + 1):
        clock.now = float(second)
        signal.observe(readings)
    assert signal.read().refusals == refusals


def test_an_idle_pod_reads_zero_at_the_first_tick_after_its_load() -> None:
    """A stream running, the engine at 12.8 % of its KV: 0.16. The stream ends and the next
    tick reads an empty engine: 0 at once, not the held 0.16 for 30 s; under load, it holds."""
    registry = CollectorRegistry()
    requests = Counter("sidecar_requests", "r", ["outcome"], registry=registry)
    clock = SimpleNamespace(now=0.0)
    pod = SimpleNamespace(in_use=1, queued=0)
    signal = SaturationSignal(lambda: cast("BulkheadSnapshot", pod), requests, lambda: clock.now)
    declared = NOTHING_DECLARED

    def tick(at: float, kv: float, running: float) -> None:
        clock.now = at
        engine = EngineReading(
            cache=None,
            kv_usage_ratio=kv,
            requests_running=running,
            requests_waiting=0.0,
            preemptions_total=0.0,
            observed_at=at,
        )
        signal.observe(Readings(declared=declared, engine=engine))

    tick(0.0, 0.128, 1)
    assert signal.read().utilisation == pytest.approx(0.16)
    tick(1.0, 0.0, 0)
    assert signal.read().utilisation == pytest.approx(0.16)  # one stream still running: held
    pod.in_use = 0
    assert signal.read().utilisation == 0.0
