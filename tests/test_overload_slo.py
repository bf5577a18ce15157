"""The overload bench's SLO arithmetic: which request met its objectives, SLO goodput beside raw
throughput, medians over repetitions, and the ratios the targets are judged on."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks.overload.plan import CONFIGS, LOADS, schedule
from benchmarks.overload.report import markdown, notes, summary, table
from benchmarks.overload.targets import Report
from demo.slo import Figures, Objectives, Record, figures, median_figures

SLO = Objectives(ttft_s=2.0, tpot_s=0.1)


@pytest.mark.parametrize(
    ("record", "met"),
    [
        pytest.param(Record("completed", 0.0, 11.0, 1.0, 101), True, id="ttft-1s-tpot-100ms"),
        pytest.param(Record("completed", 0.0, 2.0, 2.0, 1), True, id="one-token-at-the-limit"),
        pytest.param(Record("completed", 0.0, 3.0, 2.01, 10), False, id="ttft-just-over"),
        pytest.param(Record("completed", 0.0, 12.0, 1.0, 101), False, id="tpot-110ms"),
        pytest.param(Record("completed", 0.0, 1.0, None, 0), False, id="no-token-no-ttft"),
        pytest.param(Record("busy", 0.0, 0.01), False, id="a-refusal-is-a-miss"),
        pytest.param(Record("error", 0.0, 0.5), False, id="an-error-is-a-miss"),
    ],
)
def test_a_request_meets_its_objectives_or_not(record: Record, met: bool) -> None:
    """TTFT from sending and the mean time per output token after the first, both at most the
    objective; a refused or failed request is never served."""
    assert SLO.met(record) is met


def test_slo_goodput_counts_the_tokens_of_requests_that_met_them() -> None:
    """Over a 10 s window: 240 tokens met, 300 completed late; the refusals and the request
    that ended after the window are not served; offered counts what was sent inside, also
    what was still running when the window closed."""
    records = [
        Record("completed", 1.0, 3.0, 0.5, 200),  # met
        Record("completed", 1.0, 9.0, 5.0, 300),  # completed, TTFT 5 s: raw only
        Record("busy", 2.0, 2.1),
        Record("busy", 3.0, 3.3),
        Record("completed", 9.0, 12.0, 0.2, 500),  # ended after the window
        Record("completed", -3.0, 1.0, 0.1, 40),  # sent in warm-up, met inside
    ]
    sent = [r.sent_at for r in records] + [8.0]  # one still running when the window closed
    got = figures(records, 0.0, 10.0, SLO, sent=sent, preemptions=6.0)
    assert (got.slo_goodput, got.raw, got.offered_per_s) == (24.0, 54.0, 0.6)
    assert (got.completed, got.met, got.busy, got.errors) == (3, 2, 2, 0)
    assert (got.ttft_p50_s, got.ttft_p99_s) == (0.5, 5.0)
    assert got.busy_p50_s == pytest.approx(0.1)
    assert got.preemptions_per_completed == 2.0


def _figures(**changes: float) -> Figures:
    base = dict.fromkeys(Figures.__dataclass_fields__, 1.0)
    return Figures(**(base | changes))


def test_the_median_of_repetitions_skips_what_one_did_not_measure() -> None:
    """Each figure's own median; a busy p50 missing (no busy answer) in one repetition is left
    out, and missing in all stays missing."""
    reps = [
        _figures(slo_goodput=100.0, busy_p50_s=math.nan, kv_usage_mean=math.nan),
        _figures(slo_goodput=300.0, busy_p50_s=0.2, kv_usage_mean=math.nan),
        _figures(slo_goodput=200.0, busy_p50_s=0.4, kv_usage_mean=math.nan),
    ]
    got = median_figures(reps)
    assert got.slo_goodput == 200.0
    assert got.busy_p50_s == pytest.approx(0.3)
    assert math.isnan(got.kv_usage_mean)


def _run(rep: int, load: str, config: str, *, tokens: int, ttft: float, busy_s: float) -> Any:
    """A recorded run of 10 s: ten completions of ``tokens`` tokens at ``ttft`` (100 tokens a
    second after it), sent every half second, and two busy answers of ``busy_s``."""
    records = [
        ["completed", t / 2, t / 2 + ttft + (tokens - 1) / 100, ttft, tokens, None, ""]
        for t in range(10)
    ]
    records += [["busy", 1.0, 1.0 + busy_s, 0.5, ""] for _ in range(2)]
    records = [r if len(r) == 7 else [r[0], r[1], r[2], None, 0, r[3], r[4]] for r in records]
    samples = [[0.0, 0.5, 10, 0, 7.0], [9.5, 0.9, 12, 3, 10.0]]
    sent = [r[1] for r in records]
    return {
        "rep": rep,
        "load": load,
        "config": config,
        "label": config,
        "window_s": 10.0,
        "sent": sent,
        "records": records,
        "engine_samples": samples,
    }


def _document(runs: list[Any]) -> Any:
    return {
        "objectives": {"ttft_s": 2.0, "tpot_s": 0.1},
        "measure_s": 10.0,
        "warmup_s": 2.0,
        "repetitions": 3,
        "loads": {"closed-long": "test"},
        "runs": runs,
    }


def test_targets_are_judged_on_the_median_of_paired_ratios() -> None:
    """closed-long, three repetitions: the sidecar's SLO goodput over the better of vLLM alone
    (TTFT 3 s: nothing met) and its cap is 1.0x, 1.5x, 2.0x: median 1.5x >= 1.2, yes, and the
    worst 1.0x >= 0.8, yes; raw over vLLM alone 0.5x: NO; its TTFT p99 1.0 s under the cap's
    1.5 s: yes; busy p50 0.05 s: yes."""
    runs = []
    for rep, ours in enumerate((100, 150, 200)):
        runs += [
            _run(rep, "closed-long", "alone", tokens=200, ttft=3.0, busy_s=0.01),
            _run(rep, "closed-long", "queued-reqs", tokens=100, ttft=1.5, busy_s=0.01),
            _run(rep, "closed-long", "sidecar", tokens=ours, ttft=1.0, busy_s=0.05),
        ]
    # A calibration run (repetition -1) is left out.
    runs.append(_run(-1, "closed-long", "alone", tokens=999, ttft=0.1, busy_s=0.0))
    report = Report(_document(runs))
    lines = [c.line() for c in report.checks("closed-long")]
    assert lines == [
        "closed-long   yes  SLO goodput 1.50x the better of alone and queued-reqs (>= 1.2x)",
        "closed-long   yes  SLO goodput's worst repetition 1.00x the better of alone and "
        "queued-reqs (>= 0.8x)",
        "closed-long   NO   raw tok/s 0.75x the engine alone (>= 0.9x)",
        "closed-long   yes  TTFT p99 1.00 s <= the queue cap's 1.50 s",
        "closed-long   yes  busy answer p50 0.050 s <= 0.1 s",
    ]
    alone = report.median("closed-long", "alone")
    assert (alone.slo_goodput, alone.raw, alone.preemptions_per_completed) == (0.0, 200.0, 0.3)
    assert "| sidecar | 1.2 | 150 | 150 | 10 / 10 | 1.00 / 1.00 | 0.050 | 0.30 | 0.70 | 11.0 |" in (
        markdown(report)
    )


def test_every_configuration_meets_every_load_in_each_repetition_in_turn() -> None:
    """Repetition by repetition, load by load; the configurations' order turns each time;
    the emulator has no token cap; sidecar-b (a second sidecar) comes last."""
    runs = schedule(2, LOADS[2:], CONFIGS)
    names = [(rep, spec.name, config.name) for rep, spec, config in runs]
    assert names == [
        (0, "open-long", "alone"),
        (0, "open-long", "queued-reqs"),
        (0, "open-long", "queued-tokens"),
        (0, "open-long", "sidecar"),
        (0, "open-long", "sidecar-b"),
        (0, "gpu-long", "alone"),
        (0, "gpu-long", "queued-reqs"),
        (0, "gpu-long", "sidecar"),
        (0, "gpu-long", "sidecar-b"),
        (1, "open-long", "queued-reqs"),
        (1, "open-long", "queued-tokens"),
        (1, "open-long", "sidecar"),
        (1, "open-long", "sidecar-b"),
        (1, "open-long", "alone"),
        (1, "gpu-long", "queued-reqs"),
        (1, "gpu-long", "sidecar"),
        (1, "gpu-long", "sidecar-b"),
        (1, "gpu-long", "alone"),
    ]


@pytest.mark.parametrize(
    ("ours", "theirs", "text", "ok"),
    [
        pytest.param(50, 0, "more than any multiple of (theirs: 0)", True, id="some-over-none"),
        pytest.param(0, 0, "0.00x", False, id="none-over-none-is-no-win"),
        pytest.param(0, 40, "0.00x", False, id="none-over-some"),
    ],
)
def test_a_goodput_ratio_over_nothing(ours: int, theirs: int, text: str, ok: bool) -> None:
    """Where vLLM alone and its cap met no objective, any SLO goodput at all is a win, and
    none is not."""
    runs = []
    for rep in range(3):
        runs += [
            _run(rep, "closed-long", "alone", tokens=200, ttft=3.0, busy_s=0.01),
            _run(
                rep,
                "closed-long",
                "queued-reqs",
                tokens=theirs or 200,
                ttft=1.5 if theirs else 3.0,
                busy_s=0.01,
            ),
            _run(
                rep,
                "closed-long",
                "sidecar",
                tokens=ours or 200,
                ttft=1.0 if ours else 3.0,
                busy_s=0.05,
            ),
        ]
    check = Report(_document(runs)).checks("closed-long")[0]
    assert (check.text.split(" ", 2)[2].startswith(text), check.ok) == (True, ok)


def test_a_recorded_run_reads_as_it_was_printed() -> None:
    """The open-long load of a real short run (15 s, vLLM 0.32 on CPU, docs/lab/overload.md):
    its records give back the figures and the verdicts that run printed."""
    document = json.loads(
        (Path(__file__).parent / "fixtures" / "overload" / "open-long-short-run.json").read_text()
    )
    report = Report(document)
    rows = {row[0]: row[1:6] for row in table(report, "open-long")}
    assert rows == {
        "vllm alone": ["7.2", "1,341", "1,341", "92 / 92", "0.64 / 1.66"],
        "vllm --max-num-queued-reqs 32": ["7.7", "245", "1,141", "5 / 76", "3.70 / 7.26"],
        "sidecar, defaults": ["7.1", "449", "817", "25 / 52", "2.08 / 3.06"],
    }
    assert [(c.ok, c.text) for c in report.checks("open-long")] == [
        (False, "SLO goodput 0.34x the better of alone and queued-reqs (>= 1.2x)"),
        (
            False,
            "SLO goodput's worst repetition 0.34x the better of alone and queued-reqs (>= 0.8x)",
        ),
        (False, "raw tok/s 0.61x the engine alone (>= 0.9x)"),
        (True, "TTFT p99 3.06 s <= the queue cap's 7.26 s"),
        (True, "busy answer p50 0.021 s <= 0.1 s"),
    ]


def _point(rep: int, load: str, clients: int, *, tokens: int) -> Any:
    """A sweep point's run: the engine alone at ``clients``, every request within the
    objectives (``tokens`` tok/s of SLO goodput)."""
    run = _run(rep, load, f"alone-{clients}", tokens=tokens, ttft=1.0, busy_s=0.01)
    return run | {"clients": clients, "sweep": True, "label": f"vllm alone, {clients} clients"}


def test_the_sidecar_is_judged_against_the_engines_best_operating_point() -> None:
    """Per repetition the best of the sweep and of vLLM alone at its 96 clients: 36 clients
    (200 tok/s), then 24 (250), then the 96 of alone (300); the sidecar's 190, 200 and 150 are
    0.95x, 0.80x and 0.50x of it: median 0.80x < 0.9, NO, its worst repetition 0.50x shown."""
    runs = []
    for rep, (at_24, alone, ours) in enumerate(((150, 0, 190), (250, 0, 200), (200, 300, 150))):
        runs += [
            _point(rep, "closed-short", 24, tokens=at_24),
            _point(rep, "closed-short", 36, tokens=200),
            _run(
                rep,
                "closed-short",
                "alone",
                tokens=alone or 99,
                ttft=1.0 if alone else 3.0,
                busy_s=0.0,
            ),
            _run(rep, "closed-short", "sidecar", tokens=ours, ttft=1.0, busy_s=0.05),
        ]
    report = Report(_document(runs) | {"sweep": [24, 36]})
    assert [(p.clients, p.slo_goodput) for p in report.best_points("closed-short")] == [
        (36, 200.0),
        (24, 250.0),
        (96, 300.0),
    ]
    best_point = [c for c in report.checks("closed-short") if "best operating point" in c.text]
    assert [(c.ok, c.text) for c in best_point] == [
        (
            False,
            "SLO goodput 0.80x the engine's best operating point (worst repetition 0.50x; >= 0.9x)",
        )
    ]
    assert notes(report, "closed-short") == [
        "the engine's best operating point: 250 tok/s of SLO goodput (median; at 36, 24, 96 "
        "clients, repetition by repetition)"
    ]
    kept = summary(report)["closed-short"]
    assert kept["sidecar_over_best_point"] == {"median": 0.8, "worst": 0.5}
    assert kept["best_points"][1] == {"clients": 24, "slo_goodput": 250.0}
    assert "| vllm alone, 24 clients | " in markdown(report)


def test_an_open_loop_has_no_best_operating_point() -> None:
    """A run that swept client counts says why its open loop has no point and no such target,
    and a run without a sweep says nothing of it."""
    runs = [
        _run(0, "open-long", "alone", tokens=100, ttft=1.0, busy_s=0.0) | {"clients": None},
        _run(0, "open-long", "sidecar", tokens=100, ttft=1.0, busy_s=0.05) | {"clients": None},
    ]
    swept = Report(_document(runs) | {"sweep": [24, 36]})
    assert notes(swept, "open-long") == [
        "no best operating point: an open loop has no client count to sweep"
    ]
    assert not [c for c in swept.checks("open-long") if "best operating point" in c.text]
    assert notes(Report(_document(runs)), "open-long") == []


def test_the_sidecars_cgroup_is_reported_with_the_run() -> None:
    """A run with the sidecar under a quota beside a neighbour says so above the tables, and
    beside each load how often the group was throttled."""
    usage = {
        "nr_periods": 400,
        "nr_throttled": 100,
        "throttled_time": 2.5e9,
        "neighbour_cpu_s": 9.0,
    }
    runs = [
        _run(0, "closed-long", "alone", tokens=100, ttft=1.0, busy_s=0.0),
        _run(0, "closed-long", "sidecar", tokens=100, ttft=1.0, busy_s=0.05) | {"cpu_group": usage},
    ]
    cpu = {"quota_cores": 1.0, "cfs_period_us": 100000, "cfs_quota_us": 100000, "neighbour": True}
    report = Report(_document(runs) | {"sidecar_cpu": cpu})
    assert (
        "Each sidecar ran in a cgroup of its own: a CPU quota of 1 core (cpu.cfs_quota_us 100000 "
        "a 100000 us period), shared with a busy neighbour process." in markdown(report)
    )
    assert notes(report, "closed-long") == [
        "the sidecar's cgroup: throttled in 100 of 400 periods (25%), 2.5 s in all; the "
        "neighbour used 9 CPU-s (1 run, warm-up included)"
    ]
