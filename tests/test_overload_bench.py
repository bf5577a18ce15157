"""The overload benchmark's own arithmetic: what it reads from vLLM's /metrics, what it counts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.overload.engine_watch import Timeline, parse
from benchmarks.overload.load import Result, Tally, Window, backoff_s, record

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-0.32" / "metrics-after-traffic.txt"


def loaded_metrics() -> str:
    """vLLM 0.32's real /metrics text, its four series set as a loaded engine reports them."""
    values = {
        "vllm:num_requests_running{": "23.0",
        "vllm:num_requests_waiting{": "7.0",
        "vllm:kv_cache_usage_perc{": "0.93",
        "vllm:num_preemptions_total{": "41.0",
    }
    lines = []
    for line in FIXTURE.read_text().splitlines():
        value = next((v for prefix, v in values.items() if line.startswith(prefix)), None)
        lines.append(line if value is None else f"{line.rsplit(' ', 1)[0]} {value}")
    return "\n".join(lines) + "\n"


def test_a_sample_reads_the_four_series_and_not_their_neighbours() -> None:
    """num_requests_waiting_by_reason and num_preemptions_created are other series."""
    sample = parse(loaded_metrics(), at=5.0)
    assert (sample.running, sample.waiting, sample.kv_usage, sample.preemptions) == (
        23.0, 7.0, 0.93, 41.0,
    )  # fmt: skip


def test_preemptions_and_means_are_taken_inside_the_window() -> None:
    """The counter's growth between the first and last sample inside; no sample is NaN, not 0."""
    timeline = Timeline([parse(loaded_metrics(), at=t) for t in (0.0, 1.0, 2.0)])
    timeline.samples[2] = parse(loaded_metrics().replace("} 41.0", "} 50.0"), at=2.0)
    assert timeline.preempted_between(0.5, 2.5) == 9.0
    assert timeline.preempted_between(1.5, 2.5) == 0.0  # one sample inside: no growth to read
    assert timeline.mean("kv_usage", 0.0, 2.0) == pytest.approx(0.93)
    assert math.isnan(timeline.mean("kv_usage", 10.0, 20.0))


def test_only_what_ends_inside_the_window_counts() -> None:
    """Completed, busy and failed requests are counted by when they ended."""
    tally, window = Tally(), Window(10.0, 20.0)
    record(tally, Result("completed", 15.0, ttft_s=0.5, tokens=100), window)
    record(tally, Result("completed", 25.0, ttft_s=0.5, tokens=100), window)  # after: not counted
    record(tally, Result("busy", 12.0, elapsed_s=0.01), window)
    record(tally, Result("error", 13.0, detail="503 x"), window)
    assert (tally.completed, tally.tokens, tally.busy, tally.errors) == (1, 100, 1, 1)
    assert (tally.ttft_s, tally.busy_s, tally.error_kinds) == ([0.5], [0.01], {"503 x": 1})


@pytest.mark.parametrize(
    ("retry_after_s", "wait_s"),
    [
        pytest.param(None, 0.5, id="no-hint-half-a-second"),
        pytest.param(1.2, 1.2, id="the-servers-hint"),
        pytest.param(30.0, 2.0, id="a-long-hint-capped-at-2s"),
    ],
)
def test_a_busy_client_waits_the_hint_capped(retry_after_s: float | None, wait_s: float) -> None:
    """After a busy answer a closed-loop client waits what the server said, at most 2 s."""
    assert backoff_s(Result("busy", 0.0, retry_after_s=retry_after_s)) == wait_s
