"""The SLO attainment and goodput counters: each relayed stream judged once, DistServe's way."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sidecar.core.request.objectives import Objectives
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.telemetry.metrics import RequestMetrics, SloResult, slo_result

OBJECTIVES = Objectives(ttft_s=2.0, tpot_s=0.1)


def stream(first: float | None, last: float | None, tokens: int) -> StreamTiming:
    """A stream sent at t=0.5 (arrived at t=0) whose token events came at ``first``..``last``."""
    return StreamTiming(sent=0.5, first=first, last=last, tokens=tokens)


@pytest.mark.parametrize(
    ("timing", "completed", "expected"),
    [
        pytest.param(stream(1.0, 2.0, 11), True, "met", id="within-both"),
        pytest.param(stream(2.0, 3.0, 11), True, "met", id="ttft-at-the-objective"),
        pytest.param(stream(2.01, 3.0, 11), True, "missed", id="ttft-late-from-arrival"),
        pytest.param(stream(1.0, 3.2, 11), True, "missed", id="tpot-over"),
        pytest.param(stream(1.0, 1.0, 1), True, "met", id="one-token-no-tpot"),
        pytest.param(stream(None, None, 0), True, "missed", id="completed-without-a-token"),
        pytest.param(stream(1.0, 2.0, 11), False, "unfinished", id="cancelled-or-failed"),
    ],
)
def test_each_stream_is_met_missed_or_unfinished(
    timing: StreamTiming, *, completed: bool, expected: SloResult
) -> None:
    """TTFT counts from arrival (the queue wait included); TPOT is the stream's mean."""
    assert slo_result(timing, 0.0, OBJECTIVES, completed=completed) == expected


def value(registry: CollectorRegistry, name: str, result: str) -> float:
    sample = registry.get_sample_value(name, {"result": result})
    assert sample is not None, (name, result)
    return sample


def test_streams_and_their_tokens_are_counted_by_result() -> None:
    """Met streams' tokens are the goodput; every result starts exported at 0."""
    registry = CollectorRegistry()
    metrics = RequestMetrics(registry, OBJECTIVES)
    for result in ("met", "missed", "unfinished"):
        assert value(registry, "sidecar_slo_streams_total", result) == 0
    metrics.streamed(stream(1.0, 2.0, 11), 0.0, completed=True)
    metrics.streamed(stream(1.0, 3.2, 11), 0.0, completed=True)
    metrics.streamed(stream(None, None, 0), 0.0, completed=False)
    assert value(registry, "sidecar_slo_streams_total", "met") == 1
    assert value(registry, "sidecar_slo_streams_total", "missed") == 1
    assert value(registry, "sidecar_slo_streams_total", "unfinished") == 1
    assert value(registry, "sidecar_slo_tokens_total", "met") == 11
    assert value(registry, "sidecar_slo_tokens_total", "missed") == 11


def test_the_objectives_are_the_settings_defaults() -> None:
    """Without objectives given, the counters judge by the 2 s / 100 ms defaults."""
    assert RequestMetrics(CollectorRegistry()).objectives == Objectives(2.0, 0.1)
