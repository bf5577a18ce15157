"""The overload benchmark's own arithmetic: what it reads from vLLM's /metrics, what it counts."""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path

import aiohttp
import pytest

from benchmarks.overload.engine_watch import Timeline, parse
from benchmarks.overload.load import Load, Tally, Window, backoff_s, open_loop
from benchmarks.overload.plan import Config, sidecar_settings
from demo.slo import Record

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
    series = (sample.running, sample.waiting, sample.kv_usage, sample.preemptions)
    assert series == (23.0, 7.0, 0.93, 41.0)


def test_preemptions_and_means_are_taken_inside_the_window() -> None:
    """The counter's growth between the first and last sample inside; no sample is NaN, not 0."""
    timeline = Timeline([parse(loaded_metrics(), at=t) for t in (0.0, 1.0, 2.0)])
    timeline.samples[2] = parse(loaded_metrics().replace("} 41.0", "} 50.0"), at=2.0)
    assert timeline.preempted_between(0.5, 2.5) == 9.0
    assert timeline.preempted_between(1.5, 2.5) == 0.0  # one sample inside: no growth to read
    assert timeline.mean("kv_usage", 0.0, 2.0) == pytest.approx(0.93)
    assert math.isnan(timeline.mean("kv_usage", 10.0, 20.0))


@pytest.mark.parametrize(
    ("retry_after_s", "wait_s"),
    [
        pytest.param(None, 0.5, id="no-hint-the-sdks-first-delay"),
        pytest.param(0.3, 0.3, id="the-servers-hint"),
        pytest.param(30.0, 1.0, id="a-long-hint-capped-at-1s"),
    ],
)
def test_a_busy_client_waits_the_hint_capped(retry_after_s: float | None, wait_s: float) -> None:
    """After a busy answer a closed-loop client waits what the server said, at most 1 s."""
    assert backoff_s(Record("busy", 0.0, 0.01, retry_after_s=retry_after_s)) == wait_s


def test_a_second_sidecar_runs_with_settings_of_its_own() -> None:
    """OVERLOAD_SIDECAR_B's pairs become sidecar-b's settings and its label; bad text stops."""
    pairs = sidecar_settings("SLO_LAW=queue, max_wait_ms=1000")
    assert pairs == (("slo_law", "queue"), ("max_wait_ms", "1000"))
    assert Config("sidecar-b", behind_sidecar=True, settings=pairs).label("vllm") == (
        "sidecar, slo_law=queue, max_wait_ms=1000"
    )
    assert Config("sidecar", behind_sidecar=True).label("vllm") == "sidecar, defaults"
    with pytest.raises(SystemExit, match="OVERLOAD_SIDECAR_B"):
        sidecar_settings("slo_law")


async def test_the_open_loop_offers_its_rate_however_late_its_loop_wakes() -> None:
    """A client loop that wakes half a second late each turn (busy relaying streams) still
    offers ``rate`` requests a second: the arrivals due by then go out together, each tallied
    at its scheduled time, each record at the time it really went out."""
    now = 0.0

    async def late_sleep(delay_s: float) -> None:
        nonlocal now
        await asyncio.sleep(0)  # a turn of the loop: the arrivals just created go out
        now += delay_s + 0.5

    async def send(
        _session: aiohttp.ClientSession, _url: str, _load: Load, _model: str, _rng: random.Random
    ) -> Record:
        return Record("completed", now, now, 0.0, 1)

    tally = Tally()
    load = Load("open", prompt_words=8, rate=10.0)
    await open_loop(
        "http://127.0.0.1:9",
        load,
        "m",
        Window(0.0, 100.0),
        tally,
        clock=lambda: now,
        sleep=late_sleep,
        send=send,
    )
    assert 9.0 < len(tally.sent) / 100.0 < 11.0
    assert now <= 101.0  # it ended with its window (two late wakes), not minutes behind it
    assert tally.sent == sorted(tally.sent)
    assert tally.sent[0] >= 0.0
    assert tally.sent[-1] < 100.0
    assert len(tally.records) == len(tally.sent)
    late = [record.sent_at - due for record, due in zip(tally.records, tally.sent, strict=True)]
    assert min(late) >= 0.0  # never before its time
    assert max(late) <= 0.5  # late by the loop's late wake, no more
