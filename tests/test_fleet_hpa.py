"""The HPA algorithm of bench-fleet (benchmarks/fleet/hpa.py) against the Kubernetes page that
documents it: https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/"""

from __future__ import annotations

import pytest

from benchmarks.fleet.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    History,
    PodSample,
    Policy,
    Rules,
    Spec,
    decide,
    external_proposal,
    pods_proposal,
)

SHIPPED = Spec(
    min_replicas=1,
    max_replicas=8,
    scale_up=Rules(window_s=0, policies=(Policy("Pods", 2, 60),)),
    scale_down=Rules(window_s=600, policies=(Policy("Pods", 1, 300),)),
)
FREE = Rules(window_s=0, policies=(Policy("Percent", 1000, 1),))


def ready(*values: float | None) -> list[PodSample]:
    return [PodSample(ready=True, value=v) for v in values]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(0.2, 8, id="200m-of-100m-doubles"),
        pytest.param(0.05, 2, id="50m-of-100m-halves"),
        pytest.param(0.105, 4, id="within-tolerance-no-change"),
        pytest.param(0.115, 5, id="just-outside-tolerance-scales"),
    ],
)
def test_the_ratio_sets_the_replicas(value: float, expected: int) -> None:
    """desiredReplicas = ceil(currentReplicas * currentMetricValue / desiredMetricValue), no
    change within the 0.1 tolerance (the page's 200m / 100m and 50m / 100m examples)."""
    assert pods_proposal(ready(value, value, value, value), 0.1, current=4) == expected


def test_a_missing_metric_counts_as_the_target_on_a_scale_down() -> None:
    """The page: on a scale-down, a pod without a metric is assumed at 100 % of the target."""
    # Three pods at half the target would ask for 2; the fourth, at the target, makes it 3.
    assert pods_proposal(ready(0.05, 0.05, 0.05, None), 0.1, current=4) == 3


def test_unready_pods_keep_a_scale_up_from_turning_into_a_scale_down() -> None:
    """The page: not-ready pods count as 0 on a scale-up; if the ratio then points the other
    way, the HPA does not scale (two ready pods at 1.5x would otherwise ask for 3 of 4)."""
    samples = [*ready(0.15, 0.15), PodSample(ready=False, value=None), PodSample(False, None)]
    assert pods_proposal(samples, 0.1, current=4) == 4


def test_unready_pods_are_ignored_on_a_scale_down() -> None:
    """Not-ready pods are set aside, and only filled in on a scale-up."""
    samples = [*ready(0.02, 0.02), PodSample(ready=False, value=0.5)]
    assert pods_proposal(samples, 0.1, current=3) == 1


def test_no_ready_pod_with_a_metric_means_no_proposal() -> None:
    """The controller does not scale without a single metric from a ready pod."""
    assert pods_proposal([PodSample(ready=False, value=1.0), *ready(None)], 0.1, current=2) is None


@pytest.mark.parametrize(
    ("total", "current", "expected"),
    [
        pytest.param(2.4, 1, 3, id="sum-2.4-of-0.8-asks-3"),
        pytest.param(1.7, 2, 2, id="within-tolerance-of-2"),
        pytest.param(0.1, 4, 1, id="idle-asks-1"),
    ],
)
def test_an_external_average_value_divides_the_sum_by_the_target(
    total: float, current: int, expected: int
) -> None:
    """KEDA's AverageValue trigger: ceil(sum / threshold), tolerance on sum / (threshold x
    current)."""
    assert external_proposal(total, 0.8, current) == expected


def test_scale_down_uses_the_highest_proposal_in_its_window() -> None:
    """The page: with stabilizationWindowSeconds, scale-down takes the highest recommendation
    of the window (600 s shipped), so a dip does not give a pod back."""
    history = History(proposals=((0.0, 5), (100.0, 3)))
    decision = decide(SHIPPED, history, now=200.0, current=5, proposal=1)
    assert (decision.stabilized, decision.desired) == (5, 5)


def test_scale_down_after_the_window_goes_one_policy_step() -> None:
    """Past the window, the shipped policy (1 pod per 300 s) removes one pod."""
    history = History(proposals=((0.0, 5),))
    decision = decide(SHIPPED, history, now=700.0, current=5, proposal=1)
    assert (decision.desired, decision.limited_by) == (4, "ScaleDownLimit")


def test_a_scale_down_policy_counts_the_pods_removed_in_its_period() -> None:
    """Pods removed within periodSeconds count against the policy: no second pod in 300 s."""
    first = decide(SHIPPED, History(), now=700.0, current=5, proposal=1)
    again = decide(SHIPPED, first.history, now=800.0, current=4, proposal=1)
    later = decide(SHIPPED, again.history, now=1001.0, current=4, proposal=1)
    assert (first.desired, again.desired, later.desired) == (4, 4, 3)


def test_scale_up_policy_limits_pods_per_period() -> None:
    """The shipped scale-up policy: 2 pods per 60 s, the pods added in the period counted."""
    first = decide(SHIPPED, History(), now=0.0, current=1, proposal=8)
    again = decide(SHIPPED, first.history, now=30.0, current=3, proposal=8)
    later = decide(SHIPPED, again.history, now=61.0, current=3, proposal=8)
    assert (first.desired, again.desired, later.desired) == (3, 3, 5)


@pytest.mark.parametrize(
    ("select", "expected"),
    [
        pytest.param("Max", 20, id="max-takes-100-percent"),
        pytest.param("Min", 14, id="min-takes-4-pods"),
        pytest.param("Disabled", 10, id="disabled-no-scale-up"),
    ],
)
def test_select_policy_picks_among_the_scale_up_policies(select: str, expected: int) -> None:
    """The page's default scale-up (100 % or 4 pods per 15 s) under each selectPolicy."""
    rules = Rules(window_s=0, policies=DEFAULT_SCALE_UP.policies, select=select)
    spec = Spec(min_replicas=1, max_replicas=100, scale_up=rules)
    assert decide(spec, History(), now=0.0, current=10, proposal=100).desired == expected


def test_the_pages_scale_down_example_80_to_10() -> None:
    """The page: Pods 4 and Percent 10 per 60 s, from 80 replicas: 8 removed first, then from
    72, 10 % is 7.2, rounded up to 8."""
    rules = Rules(window_s=0, policies=(Policy("Pods", 4, 60), Policy("Percent", 10, 60)))
    spec = Spec(min_replicas=1, max_replicas=100, scale_up=FREE, scale_down=rules)
    first = decide(spec, History(), now=0.0, current=80, proposal=10)
    second = decide(spec, first.history, now=61.0, current=72, proposal=10)
    assert (first.desired, second.desired) == (72, 64)


def test_percent_scale_up_rounds_up() -> None:
    """A Percent policy's limit is rounded up, so a small fleet can still grow."""
    rules = Rules(window_s=0, policies=(Policy("Percent", 10, 60),))
    spec = Spec(min_replicas=1, max_replicas=10, scale_up=rules)
    assert decide(spec, History(), now=0.0, current=1, proposal=5).desired == 2


def test_scale_up_window_uses_the_lowest_proposal() -> None:
    """A scale-up stabilization window takes the lowest recommendation of the window."""
    rules = Rules(window_s=60, policies=FREE.policies)
    spec = Spec(min_replicas=1, max_replicas=10, scale_up=rules)
    history = History(proposals=((0.0, 2),))
    assert decide(spec, history, now=30.0, current=1, proposal=6).desired == 2


@pytest.mark.parametrize(
    ("proposal", "expected", "reason"),
    [
        pytest.param(20, 8, "TooManyReplicas", id="max-replicas"),
        pytest.param(0, 1, "TooFewReplicas", id="min-replicas"),
    ],
)
def test_bounds_clamp_the_desired_replicas(proposal: int, expected: int, reason: str) -> None:
    """minReplicas and maxReplicas bound what the policies allow."""
    spec = Spec(min_replicas=1, max_replicas=8, scale_up=FREE, scale_down=FREE)
    decision = decide(spec, History(), now=0.0, current=4, proposal=proposal)
    assert (decision.desired, decision.limited_by) == (expected, reason)


def test_a_fleet_outside_its_bounds_is_brought_back_first() -> None:
    """Replicas above maxReplicas go to maxReplicas, whatever the metric says."""
    assert decide(SHIPPED, History(), now=0.0, current=12, proposal=12).desired == 8


def test_the_default_scale_down_waits_300_s() -> None:
    """The page's default behavior: scale-down stabilization 300 s."""
    spec = Spec(min_replicas=1, max_replicas=10, scale_down=DEFAULT_SCALE_DOWN)
    history = decide(spec, History(), now=0.0, current=4, proposal=4).history
    held = decide(spec, history, now=299.0, current=4, proposal=1)
    freed = decide(spec, held.history, now=301.0, current=4, proposal=1)
    assert (held.desired, freed.desired) == (4, 1)
