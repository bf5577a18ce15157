"""The signal's slots term: an engine whose sequence cap binds before its KV cache, its latency
flat with its batch, reads its running requests over the cap, not the KV cache's low share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import pytest
from prometheus_client import CollectorRegistry, Counter

from sidecar.core.laws.saturation import TERM_MAX, slot_use
from sidecar.core.request.objectives import Objectives
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings
from sidecar.live.probes import EngineReading
from sidecar.live.sources import Readings
from sidecar.telemetry.saturation_metrics import SaturationSignal
from tests.declared import NOTHING_DECLARED
from tests.servers import BASE_ENV

if TYPE_CHECKING:
    from sidecar.limiter.events import BulkheadSnapshot


def engine(running: float | None, kv: float = 0.22, slots: int | None = None) -> Readings:
    """A tick's readings: the engine runs ``running`` requests with ``kv`` of its cache in use,
    and states ``slots`` sequences at once where it says them (llama.cpp)."""
    reading = EngineReading(
        cache=None,
        kv_usage_ratio=kv,
        requests_running=running,
        requests_waiting=0.0,
        preemptions_total=0.0,
        observed_at=0.0,
        slots=slots,
    )
    return Readings(declared=NOTHING_DECLARED, engine=reading)


@dataclass
class Pod:
    """A signal (objectives 2 s and 100 ms) told the engine's ``max_num_seqs``, over a bulkhead
    with ``in_use`` streams, read on a clock the test sets (``now``)."""

    max_num_seqs: int | None = None
    now: float = 0.0
    in_use: int = 7
    queued: int = 0
    signal: SaturationSignal = field(init=False)

    def __post_init__(self) -> None:
        self.signal = SaturationSignal(
            lambda: cast("BulkheadSnapshot", self),
            Counter("sidecar_requests", "r", ["outcome"], registry=CollectorRegistry()),
            lambda: self.now,
            objectives=Objectives(ttft_s=2.0, tpot_s=0.1),
            max_num_seqs=self.max_num_seqs,
        )

    def fast_streams(self, count: int) -> None:
        """Streams that met their objectives with room to spare: TTFT 0.2 s (0.1 of 2 s),
        20 ms a token (0.2 of 100 ms)."""
        for _ in range(count):
            timing = StreamTiming(sent=self.now)
            self.signal.track(timing, self.now)
            for i in range(40):
                timing.saw(1, self.now + 0.2 + i * 0.02)
            self.signal.streamed(timing, self.now, completed=True)


@pytest.mark.parametrize(
    ("running", "max_num_seqs", "engine_slots", "expected"),
    [
        pytest.param(7.0, 8, None, 0.875, id="seven-of-eight-set-by-the-operator"),
        pytest.param(3.0, None, 4, 0.75, id="the-engines-stated-slots"),
        pytest.param(4.0, 8, 4, 0.5, id="the-setting-wins-over-the-engine"),
        pytest.param(7.0, None, None, None, id="no-cap-no-term"),
        pytest.param(None, 8, None, None, id="the-engine-said-nothing-of-what-runs"),
    ],
)
def test_slot_use_counts_running_requests_against_the_cap(
    running: float | None, max_num_seqs: int | None, engine_slots: int | None, expected: float
) -> None:
    """The cap is the setting, else the engine's slots; without either there is no reading."""
    assert slot_use(running, max_num_seqs=max_num_seqs, engine_slots=engine_slots) == expected


@pytest.mark.parametrize(
    ("max_num_seqs", "engine_slots", "utilisation", "slots"),
    [
        pytest.param(8, None, 0.875, 0.875, id="vllm-told-its-max-num-seqs"),
        pytest.param(None, 8, 0.875, 0.875, id="llamacpp-stating-its-slots"),
        pytest.param(8, 16, 0.875, 0.875, id="the-setting-wins-over-the-engine"),
        pytest.param(None, None, 0.22, 0.0, id="no-cap-reads-the-kv-cache-alone"),
    ],
)
def test_seven_of_eight_sequences_read_near_capacity(
    max_num_seqs: int | None, engine_slots: int | None, utilisation: float, slots: float
) -> None:
    """7 of 8 sequences running, the streams well within their objectives, the KV cache 22 %
    full: the pod reads 0.875, not 0.22, once the cap is known."""
    pod = Pod(max_num_seqs=max_num_seqs)
    pod.fast_streams(5)
    for second in range(10):
        pod.now = float(second)
        pod.signal.observe(engine(7.0, slots=engine_slots))
    read = pod.signal.read()
    assert (read.ttft, read.tpot, read.kv) == pytest.approx((0.1, 0.2, 0.22))
    assert (read.utilisation, read.slots) == pytest.approx((utilisation, slots))


def test_slots_are_the_mean_over_the_window() -> None:
    """6 then 8 of 8 running read 0.875; once the 6 is past the 30 s window, 1."""
    pod = Pod(max_num_seqs=8)
    pod.signal.observe(engine(6.0))
    pod.now = 10.0
    pod.signal.observe(engine(8.0))
    pod.now = 20.0
    assert pod.signal.read().slots == pytest.approx(0.875)
    pod.now = 35.0
    assert pod.signal.read().slots == pytest.approx(1.0)


def test_the_slots_term_stops_at_term_max() -> None:
    """A cap set below what the engine runs (8 running against 2) reads 2, not 4."""
    pod = Pod(max_num_seqs=2)
    pod.signal.observe(engine(8.0))
    pod.now = 1.0
    assert pod.signal.read().slots == TERM_MAX


def test_the_setting_reaches_the_sidecars_signal() -> None:
    """SIDECAR_ENGINE_MAX_NUM_SEQS=8 and an engine running 7: the sidecar's signal counts 7/8."""
    server = SidecarServer(load_settings({**BASE_ENV, "SIDECAR_ENGINE_MAX_NUM_SEQS": "8"}))
    server.signal.observe(engine(7.0))
    assert server.signal.evidence().slots == pytest.approx(0.875)
