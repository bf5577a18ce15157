"""bench-fleet reads its autoscaler from the shipped deploy/k8s objects (manifests.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks.fleet.manifests import (
    HPA,
    SCALED_OBJECT,
    ManifestError,
    quantity,
    read_hpa,
    read_keda,
)


def test_the_scaled_object_reads_as_a_sum_over_the_pods() -> None:
    """The shipped trigger: sidecar_utilisation summed over the pods, AverageValue."""
    keda = read_keda()
    assert (keda.metric, keda.metric_type) == ("sidecar_utilisation", "AverageValue")
    assert keda.query.startswith("sum(sidecar_utilisation")


def test_the_scaled_object_gives_what_its_file_says() -> None:
    """Bounds, pollingInterval, threshold and each behavior policy, as written in the file."""
    raw = yaml.safe_load(SCALED_OBJECT.read_text())["spec"]
    behavior = raw["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    keda = read_keda()
    assert (keda.spec.min_replicas, keda.spec.max_replicas, keda.polling_s) == (
        raw["minReplicaCount"],
        raw["maxReplicaCount"],
        raw["pollingInterval"],
    )
    assert keda.threshold == float(raw["triggers"][0]["metadata"]["threshold"])
    for rules, direction in ((keda.spec.scale_up, "scaleUp"), (keda.spec.scale_down, "scaleDown")):
        shipped = behavior[direction]
        assert rules.window_s == shipped["stabilizationWindowSeconds"]
        assert [(p.kind, p.value, p.period_s) for p in rules.policies] == [
            (p["type"], p["value"], p["periodSeconds"]) for p in shipped["policies"]
        ]


def test_the_hpa_and_the_scaled_object_agree() -> None:
    """The two shipped ways to scale on the signal: same metric, target, bounds and behavior."""
    keda, hpa = read_keda(), read_hpa()
    assert (hpa.metric, hpa.target, hpa.spec) == (keda.metric, keda.threshold, keda.spec)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("800m", 0.8, id="milli"),
        pytest.param("0.8", 0.8, id="decimal"),
        pytest.param(5, 5.0, id="integer"),
        pytest.param("2k", 2000.0, id="kilo"),
        pytest.param("1Ki", 1024.0, id="kibi"),
    ],
)
def test_quantities_read_as_kubernetes_writes_them(text: str | int, value: float) -> None:
    """averageValue and threshold are Kubernetes quantities."""
    assert quantity(text) == pytest.approx(value)


def test_a_query_that_is_not_a_sum_is_refused(tmp_path: Path) -> None:
    """The bench models the query as a sum over the pods; anything else is not read."""
    document = yaml.safe_load(SCALED_OBJECT.read_text())
    document["spec"]["triggers"][0]["metadata"]["query"] = "max(sidecar_utilisation)"
    path = tmp_path / "scaledobject.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ManifestError, match="not a sum"):
        read_keda(path)


def test_an_hpa_with_another_kind_is_refused() -> None:
    """The reader names the object it expected."""
    with pytest.raises(ManifestError, match="not a HorizontalPodAutoscaler"):
        read_hpa(SCALED_OBJECT)
    assert read_hpa(HPA).metric == "sidecar_utilisation"
