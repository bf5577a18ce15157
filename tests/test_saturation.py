"""The scale-out signal's arithmetic: each term by hand, the largest wins, the windows forget,
the unloaded floor is remembered, an idle pod reads 0."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest
from prometheus_client import CollectorRegistry, Counter

from sidecar.core.laws.saturation import (
    CAPACITY_REFUSALS,
    LatencyShare,
    MeanWindow,
    OutcomeWindow,
    SaturationConfig,
    SaturationEvidence,
    load_band,
    saturation,
)
from sidecar.core.outcomes import EDGE_FAULTS, REJECTIONS
from sidecar.core.request.objectives import Objectives
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.live.probes import EngineReading
from sidecar.live.sources import Readings
from sidecar.telemetry.saturation_metrics import SaturationSignal
from tests.declared import NOTHING_DECLARED

if TYPE_CHECKING:
    from sidecar.limiter.events import BulkheadSnapshot

CONFIG = SaturationConfig()


@pytest.mark.parametrize(
    ("evidence", "utilisation", "term"),
    [
        pytest.param(
            SaturationEvidence(loaded=True, ttft=0.3, tpot=0.45, kv=0.2),
            0.45,
            "tpot",
            id="compute-bound",
        ),
        pytest.param(
            SaturationEvidence(loaded=True, ttft=0.7, tpot=0.45), 0.7, "ttft", id="prefill-bound"
        ),
        pytest.param(
            SaturationEvidence(loaded=True, tpot=0.1, kv=0.85), 0.85, "kv", id="memory-bound"
        ),
        pytest.param(
            SaturationEvidence(loaded=True, tpot=0.1, kv=0.22, slots=0.875),
            0.875,
            "slots",
            id="sequence-bound",
        ),
        # One refusal in four lately: 1 + 0.25, whatever the latency says.
        pytest.param(
            SaturationEvidence(loaded=True, tpot=0.6, recent_offered=400, recent_refused=100),
            1.25,
            "refusals",
            id="refusing",
        ),
        pytest.param(
            SaturationEvidence(loaded=True, recent_offered=10, recent_refused=10),
            2.0,
            "refusals",
            id="refusing-everything",
        ),
        pytest.param(
            SaturationEvidence(loaded=True, ttft=1.8), 1.8, "ttft", id="missing-the-ttft-objective"
        ),
    ],
)
def test_the_signal_is_the_largest_term(
    evidence: SaturationEvidence, utilisation: float, term: str
) -> None:
    """The utilisation equals its largest term, and that term is the one expected."""
    result = saturation(evidence)
    assert result.utilisation == pytest.approx(utilisation)
    assert getattr(result, term) == pytest.approx(utilisation)


def test_once_the_load_has_ended_every_term_reads_zero() -> None:
    """Nothing in flight or waiting: 0, though the window still holds the load's latency and
    refusals (an autoscaler's scale-down starts at the next scrape)."""
    busy = SaturationEvidence(
        ttft=1.4, tpot=0.9, kv=0.7, slots=0.9, recent_offered=10, recent_refused=5
    )
    assert saturation(busy).to_dict() == dict.fromkeys(
        ("utilisation", "ttft", "tpot", "kv", "slots", "refusals"), 0.0
    )


def test_any_refusal_reaches_one() -> None:
    """One refusal among many is enough for 1 or more."""
    evidence = SaturationEvidence(loaded=True, recent_offered=1000, recent_refused=1)
    assert saturation(evidence).utilisation > 1


def latency(
    samples: list[tuple[float, float]], config: SaturationConfig = CONFIG, load: int = 1
) -> LatencyShare:
    """Samples (time, ratio), each taken while ``load`` requests ran."""
    share = LatencyShare(config)
    for at, ratio in samples:
        share.add(at, ratio, load)
    return share


@pytest.mark.parametrize(
    ("load", "band"),
    [
        pytest.param(0, 0, id="none"),
        pytest.param(1, 0, id="alone"),
        pytest.param(2, 1, id="two"),
        pytest.param(3, 2, id="three"),
        pytest.param(4, 2, id="four"),
        pytest.param(5, 3, id="five"),
        pytest.param(8, 3, id="eight"),
        pytest.param(9, 4, id="nine"),
        pytest.param(256, 8, id="a-full-batch"),
    ],
)
def test_load_bands_double(load: int, band: int) -> None:
    """A band a doubling of the requests running: 1, 2, 3-4, 5-8, 9-16, ..."""
    assert load_band(load) == band


def test_without_a_floor_the_term_is_the_quantile_itself() -> None:
    """Nine samples (too few for a floor): the P95 of 0.1..0.9 is 0.9, over a base of 0."""
    share = latency([(1.0, r / 10) for r in range(1, 10)])
    assert share.base(1.0) == 0.0
    assert share.share(1.0) == pytest.approx(0.9)


def test_the_term_climbs_from_the_unloaded_floor_to_the_objective() -> None:
    """Streams run alone at 0.25 of the objective are the floor; then a P95 at 0.625 reads
    half of capacity ((0.625 - 0.25) / 0.75), and one at the objective reads 1."""
    share = latency([(float(t), 0.25) for t in range(30)])
    share.add(61.0, 0.625, 20)
    assert share.base(61.0) == pytest.approx(0.25)
    assert share.share(61.0) == pytest.approx(0.5)
    share.add(62.0, 1.0, 30)
    assert share.share(62.0) == pytest.approx(1.0)


def test_the_floor_is_a_band_low_tenth_not_one_lucky_stream() -> None:
    """One stream at 0.01 among nineteen at 0.3: the band's P10 is 0.3, not 0.01."""
    share = latency([(0.0, 0.01)] + [(float(t), 0.3) for t in range(1, 20)])
    assert share.base(20.0) == pytest.approx(0.3)


def test_the_floor_is_the_lightest_load_band_with_enough_samples() -> None:
    """Nine streams alone (too few) beside twenty at 5-8 running and a hundred at 9-16: the
    floor is the 5-8 band's; a tenth stream alone makes it the engine's own unloaded step."""
    share = latency([(float(t), 0.1) for t in range(9)], load=1)
    for t in range(20):
        share.add(float(t), 0.3, 6)
    for t in range(100):
        share.add(t / 10, 0.5, 12)
    assert share.base(20.0) == pytest.approx(0.3)
    share.add(20.0, 0.12, 1)
    assert share.base(20.0) == pytest.approx(0.1)


def test_a_sparse_light_load_is_the_floor_beside_busy_minutes() -> None:
    """Over ten minutes, one stream a minute ran alone (0.2) among fifty at 20-30 running
    (0.6): the floor is 0.2, where a minute's low tenth (the old design) was 0.6 every
    minute."""
    share = LatencyShare(CONFIG)
    for minute in range(10):
        share.add(minute * 60.0, 0.2, 1)
        for second in range(1, 51):
            share.add(minute * 60.0 + second, 0.6, 25)
    assert share.base(600.0) == pytest.approx(0.2)


def test_the_floor_is_capped() -> None:
    """A pod never seen lightly loaded (every sample at 0.8, 30 running) counts its floor as
    0.35 at most: at the objective it still reads 1, and 0.8 reads 0.45 / 0.65, not 0."""
    share = latency([(float(t), 0.8) for t in range(30)], load=30)
    assert share.base(30.0) == 0.35
    assert share.share(30.0) == pytest.approx(0.45 / 0.65)


def test_the_floor_is_forgotten_after_its_window() -> None:
    """A floor of 0.2 from streams run alone counts for floor_window_s; then the lightest load
    still remembered (0.3 at 20 running) stands for it; then none."""
    config = SaturationConfig(floor_window_s=600.0)
    share = latency([(float(t), 0.2) for t in range(20)], config)
    for t in range(100, 130):
        share.add(float(t), 0.3, 20)
    assert share.base(500.0) == pytest.approx(0.2)
    assert share.base(650.0) == pytest.approx(0.3)
    assert share.base(800.0) == 0.0


def test_the_window_forgets_its_samples() -> None:
    """Samples older than window_s leave the quantile; with none left the term reads 0."""
    share = latency([(0.0, 0.9), (20.0, 0.3)])
    assert share.share(25.0) == pytest.approx(0.9)
    assert share.share(31.0) == pytest.approx(0.3)
    assert share.share(51.0) == 0.0


def test_running_streams_join_the_window_but_not_the_floor() -> None:
    """Ten ended samples at 0.3 (the floor) and two streams still running at 1.0 and 1.3:
    the P95 of the twelve is the slower one's; the floor is still the ended streams' 0.3."""
    share = latency([(float(t), 0.3) for t in range(10)])
    assert share.share(10.0, running=[1.0, 1.3]) == pytest.approx((1.3 - 0.3) / 0.7)
    assert share.base(10.0) == pytest.approx(0.3)
    assert share.share(50.0, running=[0.65]) == pytest.approx(0.5)


def test_the_stores_are_bounded() -> None:
    """Ten thousand samples at one load keep at most max_samples in the window and the band
    (all at 0.3: the floor is 0.3 and the term 0)."""
    config = SaturationConfig(max_samples=100)
    share = latency([(t / 1e6, 0.3) for t in range(10_000)], config)
    assert share.share(0.5) == 0.0
    assert len(share._window) == 100
    assert len(share._bands[0]) == 100


def test_kv_is_the_mean_over_its_window() -> None:
    """Readings of 0.2 and 0.6 average 0.4; past the window only the later one counts."""
    kv = MeanWindow(window_s=30.0, max_samples=10)
    kv.add(0.0, 0.2)
    kv.add(10.0, 0.6)
    assert kv.mean(20.0) == pytest.approx(0.4)
    assert kv.mean(35.0) == pytest.approx(0.6)
    assert kv.mean(50.0) == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"window_s": 0}, id="window"),
        pytest.param({"quantile": 0}, id="quantile-zero"),
        pytest.param({"quantile": 1.5}, id="quantile-past-one"),
        pytest.param({"floor_cap": 1.0}, id="floor-cap-one"),
        pytest.param({"kv_full": 0}, id="kv-full"),
        pytest.param({"max_samples": 0}, id="max-samples"),
    ],
)
def test_a_bad_config_is_refused(bad: dict[str, float]) -> None:
    """Each setting out of its range is a ValueError, not a signal that divides by zero."""
    with pytest.raises(ValueError, match="must be"):
        SaturationConfig(**bad)  # type: ignore[arg-type]


def test_outcome_window_counts_what_ended_lately() -> None:
    """Deltas of cumulative counts inside the window; too_large and draining are not refusals."""
    window = OutcomeWindow(window_s=60.0)
    assert window.recent(0.0, {"completed": 100, "queue_full": 5}) == (0.0, 0.0)
    counts = {
        "completed": 150,
        "queue_full": 15,
        "too_large": 10,
        "draining": 5,
        "too_many_client_connections": 20,
    }
    assert window.recent(30.0, counts) == (95.0, 30.0)
    # Past the window, the sample of 30 s is the base: nothing new ended since.
    assert window.recent(95.0, counts) == (0.0, 0.0)


def test_capacity_refusals_are_known_outcomes() -> None:
    """Every refusal the signal counts is an outcome the sidecar can end a request with, and
    the two that are not for want of capacity stay out."""
    assert set(REJECTIONS) | set(EDGE_FAULTS) >= CAPACITY_REFUSALS
    assert {"too_large", "draining", "header_timeout", "bad_request"}.isdisjoint(CAPACITY_REFUSALS)
    assert {"queue_full", "shed", "no_capacity", "too_many_client_connections"} <= CAPACITY_REFUSALS


def pod(in_use: int = 1) -> tuple[SaturationSignal, Counter, SimpleNamespace, SimpleNamespace]:
    """A signal over a bulkhead with ``in_use`` streams and its oldest waiter's wait
    (``bulkhead.oldest_wait_s``), a fresh outcome counter, read on a clock the test sets
    (``clock.now``); objectives 2 s and 100 ms."""
    registry = CollectorRegistry()
    requests = Counter("sidecar_requests", "r", ["outcome"], registry=registry)
    clock = SimpleNamespace(now=0.0)
    bulkhead = SimpleNamespace(in_use=in_use, queued=0, oldest_wait_s=0.0)
    signal = SaturationSignal(
        lambda: cast("BulkheadSnapshot", bulkhead),
        requests,
        lambda: clock.now,
        objectives=Objectives(ttft_s=2.0, tpot_s=0.1),
        oldest_wait_s=lambda: bulkhead.oldest_wait_s,
    )
    return signal, requests, clock, bulkhead


def stream(arrived: float, first: float, last: float, tokens: int) -> StreamTiming:
    return StreamTiming(sent=arrived, first=first, last=last, tokens=tokens)


def test_a_stream_is_judged_from_its_arrival_against_the_objectives() -> None:
    """Arrived at 0, waited for admission, first token at 1.2 s (0.6 of 2 s); 11 tokens over
    0.5 s: TPOT 50 ms (0.5 of 100 ms). Nine such streams: no floor yet, the terms are the
    ratios."""
    signal, _, clock, _ = pod()
    clock.now = 1.7
    for _ in range(9):
        signal.streamed(stream(0.0, 1.2, 1.7, 11), arrived=0.0, completed=True)
    read = signal.read()
    assert (read.ttft, read.tpot) == pytest.approx((0.6, 0.5))


def test_a_stream_cut_short_gives_its_ttft_not_its_tpot() -> None:
    """A stream the client left: its first token counts, its pace does not (the client set it)."""
    signal, _, clock, _ = pod()
    clock.now = 3.0
    signal.streamed(stream(0.0, 0.4, 3.0, 3), arrived=0.0, completed=False)
    read = signal.read()
    assert (read.ttft, read.tpot) == pytest.approx((0.2, 0.0))


def test_refusals_leave_the_signal_a_window_after_they_ended_however_rarely_it_is_read() -> None:
    """Ticks sample the outcomes, so refusals read long after they ended no longer count."""
    signal, requests, clock, _ = pod()
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
def test_a_refusal_counts_for_the_window_then_leaves(read_at: float, refusals: float) -> None:
    """Ten refusals half a second in, nothing else ended, a stream still running: a scrape up
    to 30 s later still reads the pod as refusing; two seconds past that window it does not."""
    signal, requests, clock, _ = pod()
    readings = Readings(declared=NOTHING_DECLARED)
    signal.observe(readings)
    requests.labels(outcome="queue_full").inc(10)
    for second in range(1, int(read_at) + 1):
        clock.now = float(second)
        signal.observe(readings)
    assert signal.read().refusals == refusals


def test_an_idle_pod_reads_zero_at_once() -> None:
    """A stream running, the engine at 40 % of its KV: 0.4. The stream ends: 0 at once, not the
    window's 0.4 for 30 s."""
    signal, _, clock, bulkhead = pod()
    engine = EngineReading(
        cache=None,
        kv_usage_ratio=0.4,
        requests_running=1.0,
        requests_waiting=0.0,
        preemptions_total=0.0,
        observed_at=0.0,
    )
    signal.observe(Readings(declared=NOTHING_DECLARED, engine=engine))
    clock.now = 1.0
    assert signal.read().utilisation == pytest.approx(0.4)
    bulkhead.in_use = 0
    assert signal.read().utilisation == 0.0


def test_a_request_waiting_past_its_objective_reads_past_one() -> None:
    """Nothing ended yet, one request has waited 3 s for admission against a 2 s objective:
    the ttft term reads 1.5 at once; a wait still within the objective adds nothing."""
    signal, _, _, bulkhead = pod()
    bulkhead.queued, bulkhead.oldest_wait_s = 1, 3.0
    assert signal.read().ttft == pytest.approx(1.5)
    bulkhead.oldest_wait_s = 1.5
    assert signal.read().utilisation == 0.0


@pytest.mark.parametrize(
    "evidence",
    [
        pytest.param(SaturationEvidence(loaded=True, ttft=7.0), id="ttft"),
        pytest.param(SaturationEvidence(loaded=True, waited=30.0), id="a-long-wait"),
        pytest.param(SaturationEvidence(loaded=True, tpot=3.0), id="tpot"),
        pytest.param(SaturationEvidence(loaded=True, slots=2.5), id="slots"),
    ],
)
def test_no_term_reads_past_two(evidence: SaturationEvidence) -> None:
    """Latency far past its objective reads 2, as refusing everything does: overloaded, not a
    count of the pods it needs."""
    assert saturation(evidence).utilisation == 2.0
