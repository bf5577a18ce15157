"""The overload bench's sweep for the engine's best operating point: which client counts it
runs, on which loads, and how the best point and the sidecar's ratios to it are read."""

from __future__ import annotations

import math

import pytest

from benchmarks.overload.compare import Point, best, paired
from benchmarks.overload.plan import CONFIGS, LOADS, SettingError, schedule, sweep


@pytest.mark.parametrize(
    ("text", "clients"),
    [
        pytest.param(None, (24, 36, 48), id="unset-the-default"),
        pytest.param("", (24, 36, 48), id="empty-the-default"),
        pytest.param("48, 16,16", (16, 48), id="sorted-once-each"),
        pytest.param("none", (), id="none-no-sweep"),
        pytest.param("NONE", (), id="none-any-case"),
    ],
)
def test_the_sweep_runs_the_client_counts_asked_for(
    text: str | None, clients: tuple[int, ...]
) -> None:
    """OVERLOAD_SWEEP's counts, fewest first, each once; the default brackets 36 clients."""
    env = {} if text is None else {"OVERLOAD_SWEEP": text}
    assert tuple(c.clients for c in sweep(env)) == clients


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("abc", id="a-word"),
        pytest.param("24,,36", id="an-empty-item"),
        pytest.param("0,24", id="no-clients"),
        pytest.param("-8", id="negative"),
        pytest.param("1.5", id="a-fraction"),
    ],
)
def test_a_sweep_that_is_not_client_counts_stops_the_run(text: str) -> None:
    """The message names the setting and what it got."""
    with pytest.raises(SettingError, match=rf"^OVERLOAD_SWEEP: .*got {text!r}$"):
        sweep({"OVERLOAD_SWEEP": text})


def test_sweep_points_run_on_closed_loads_only_turned_with_the_others() -> None:
    """Each point runs once a repetition on each closed load, its order turned with the other
    configurations'; the open loop, which has no client count, runs none."""
    short, open_long = LOADS[0], LOADS[2]
    configs = (CONFIGS[0], CONFIGS[3], *sweep({"OVERLOAD_SWEEP": "24,36"}))
    runs = schedule(2, (short, open_long), configs)
    assert [(rep, spec.name, c.name) for rep, spec, c in runs] == [
        (0, "closed-short", "alone"),
        (0, "closed-short", "sidecar"),
        (0, "closed-short", "alone-24"),
        (0, "closed-short", "alone-36"),
        (0, "open-long", "alone"),
        (0, "open-long", "sidecar"),
        (1, "closed-short", "sidecar"),
        (1, "closed-short", "alone-24"),
        (1, "closed-short", "alone-36"),
        (1, "closed-short", "alone"),
        (1, "open-long", "sidecar"),
        (1, "open-long", "alone"),
    ]
    point = configs[2]
    assert (point.label("vllm"), point.engine_flags("vllm")) == ("vllm alone, 24 clients", ())
    assert short.load(0.0, point.clients).clients == 24
    assert short.load(0.0, None).clients == 96


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        pytest.param([(24, 900.0), (36, 1200.0), (96, 80.0)], (36, 1200.0), id="the-most"),
        pytest.param([(48, 700.0), (24, 700.0)], (24, 700.0), id="a-tie-fewer-clients"),
        pytest.param([(24, 0.0), (96, 0.0)], (24, 0.0), id="nothing-met-anywhere"),
    ],
)
def test_the_best_operating_point_is_the_most_slo_goodput(
    points: list[tuple[int, float]], expected: tuple[int, float]
) -> None:
    """Of the runs straight at the engine, the one that served the most within the
    objectives; of equals, the one with fewer clients."""
    found = best(Point(clients=n, slo_goodput=tok_s) for n, tok_s in points)
    assert found == Point(clients=expected[0], slo_goodput=expected[1])
    assert best([]) is None


@pytest.mark.parametrize(
    ("ours", "theirs", "median", "worst"),
    [
        pytest.param([900.0, 1000.0, 500.0], [1000.0, 1000.0, 1000.0], 0.9, 0.5, id="paired"),
        pytest.param([50.0, 0.0], [0.0, 0.0], math.inf, 0.0, id="over-nothing"),
        pytest.param([300.0, 200.0, 100.0], [100.0], 3.0, 3.0, id="only-repetitions-that-pair"),
    ],
)
def test_the_sidecar_over_another_repetition_by_repetition(
    ours: list[float], theirs: list[float], median: float, worst: float
) -> None:
    """Each repetition's ratio: anything over nothing infinitely more, nothing over nothing
    no win; the median and the worst of them."""
    got = paired(ours, theirs)
    assert got.median == pytest.approx(median)
    assert got.worst == pytest.approx(worst)
    assert math.isnan(paired([1.0], []).median)
