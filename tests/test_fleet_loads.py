"""bench-fleet's loads: the shapes in cluster seconds, and one trace for every configuration."""

from __future__ import annotations

import pytest

from benchmarks.fleet.loads import SHAPES, Load, arrivals
from benchmarks.fleet.report import summarise


@pytest.mark.parametrize(
    ("at", "share"),
    [
        pytest.param(60.0, 1.0, id="before-the-step"),
        pytest.param(120.0, 3.0, id="at-the-step"),
        pytest.param(719.0, 3.0, id="end-of-the-step"),
        pytest.param(720.0, 1.0, id="after-the-step"),
        pytest.param(1620.0, 0.0, id="after-the-trace"),
    ],
)
def test_the_step_goes_1x_3x_1x(at: float, share: float) -> None:
    """The step's load in shares of one pod, in cluster seconds whatever the time scale."""
    assert SHAPES["step"].share(at, scale=10) == share


def test_the_burst_lasts_20_real_seconds() -> None:
    """The burst is defined by what one pod serves for 20 s of wall clock: at a time scale of
    10 it spans 200 cluster seconds."""
    edges = SHAPES["burst"].bounds(scale=10)
    assert edges[2] - edges[1] == 200.0


def test_open_loop_arrivals_are_one_trace_per_seed() -> None:
    """Every configuration is offered the same arrivals; another seed, others."""
    load = Load(shape=SHAPES["step"], open_loop=True, pod_users=8, pod_rate=2.0, seed=47)
    again = Load(shape=SHAPES["step"], open_loop=True, pod_users=8, pod_rate=2.0, seed=47)
    other = Load(shape=SHAPES["step"], open_loop=True, pod_users=8, pod_rate=2.0, seed=48)
    assert arrivals(load, 10) == arrivals(again, 10) != arrivals(other, 10)


def test_open_loop_arrivals_follow_the_shape() -> None:
    """Three times the arrivals a second during the step (within Poisson noise)."""
    times = arrivals(
        Load(shape=SHAPES["step"], open_loop=True, pod_users=8, pod_rate=2.0, seed=47), 10
    )
    before = sum(1 for t in times if t < 120) / 12
    during = sum(1 for t in times if 120 <= t < 720) / 60
    assert before == pytest.approx(2.0, rel=0.5)
    assert during == pytest.approx(6.0, rel=0.2)


def test_a_refusal_is_a_miss_and_replica_seconds_count_loading_pods() -> None:
    """Attainment is over every request offered; a pod bills from creation to gone."""
    run = {
        "requests": [
            {
                "began": 130.0,
                "served": True,
                "ttft_s": 0.5,
                "tokens": 100,
                "busy": 0,
                "attempts": 1,
                "within": True,
            },
            {
                "began": 140.0,
                "served": False,
                "ttft_s": None,
                "tokens": 0,
                "busy": 9,
                "attempts": 9,
                "within": False,
            },
        ],
        "ticks": [{"at": 135.0, "replicas": 1, "desired": 3}],
        "pods": [
            {"created": 0.0, "ready_at": 0.0, "gone_at": None},
            {"created": 135.0, "ready_at": 250.0, "gone_at": 500.0},
        ],
        "step": (120.0, 720.0),
        "end": 1000.0,
        "scale": 10.0,
    }
    figures = summarise(run)
    assert (figures["attainment"], figures["refusals"], figures["replica_s"]) == (0.5, 9, 1365.0)
    assert (figures["to_decision_s"], figures["to_ready_s"]) == (15.0, 130.0)
