"""The shipped autoscaling objects, read at run time: deploy/k8s's KEDA ScaledObject and HPA.

The bench scales on what ships: bounds, ``behavior``, KEDA's pollingInterval and its trigger's
threshold, query and metricType come from these files, never from constants here.
KEDA's semantics (https://keda.sh/docs/latest/reference/scaledobject-spec/ and
https://keda.sh/docs/latest/scalers/prometheus/): a trigger becomes an External metric of the
HPA that KEDA creates, with ``metricType`` AverageValue by default, ``threshold`` its target;
the Prometheus query's value is the metric; ``pollingInterval`` (default 30 s) is how often KEDA
checks the trigger; ``cooldownPeriod`` only applies to scaling to zero (``minReplicaCount`` 0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from benchmarks.fleet.hpa import DEFAULT_SCALE_DOWN, DEFAULT_SCALE_UP, Policy, Rules, Spec

COMPONENTS = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "components"
SCALED_OBJECT = COMPONENTS / "keda" / "scaledobject.yaml"
HPA = COMPONENTS / "hpa" / "hpa.yaml"
# Kubernetes quantities (resource.Quantity): decimal SI and binary suffixes.
SUFFIXES = {
    "m": Decimal("0.001"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
}
QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|Ki|Mi|Gi)?$")
SUM_OF = re.compile(r"^\s*sum\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{)]")
KEDA_POLLING_S = 30.0  # pollingInterval's default


class ManifestError(ValueError):
    """A shipped object the bench cannot read as an autoscaler."""


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity ("800m", "0.8", 5) as a number."""
    match = QUANTITY.match(str(text).strip())
    if match is None:
        raise ManifestError(f"not a Kubernetes quantity: {text!r}")
    return float(Decimal(match[1]) * SUFFIXES[match[2] or ""])


@dataclass(frozen=True, slots=True, kw_only=True)
class Keda:
    """A ScaledObject's one Prometheus trigger over the HPA it drives."""

    spec: Spec
    polling_s: float
    metric: str  # the series the query sums over the pods
    query: str
    metric_type: str
    threshold: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Hpa:
    """An autoscaling/v2 HPA on one Pods metric with an AverageValue target."""

    spec: Spec
    metric: str
    target: float


def _rules(raw: dict[str, Any] | None, default: Rules) -> Rules:
    if raw is None:
        return default
    policies = tuple(
        Policy(p["type"], int(p["value"]), float(p["periodSeconds"]))
        for p in raw.get("policies", [])
    )
    return Rules(
        window_s=float(raw.get("stabilizationWindowSeconds", default.window_s)),
        policies=policies or default.policies,
        select=raw.get("selectPolicy", "Max"),
    )


def _spec(lowest: int, highest: int, behavior: dict[str, Any] | None) -> Spec:
    behavior = behavior or {}
    return Spec(
        min_replicas=lowest,
        max_replicas=highest,
        scale_up=_rules(behavior.get("scaleUp"), DEFAULT_SCALE_UP),
        scale_down=_rules(behavior.get("scaleDown"), DEFAULT_SCALE_DOWN),
    )


def _load(path: Path, kind: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    if document.get("kind") != kind:
        raise ManifestError(f"{path}: a {document.get('kind')}, not a {kind}")
    return document


def read_keda(path: Path = SCALED_OBJECT) -> Keda:
    """The ScaledObject at ``path``; its one trigger must be a Prometheus sum over the pods."""
    spec = _load(path, "ScaledObject")["spec"]
    triggers = spec["triggers"]
    if len(triggers) != 1 or triggers[0]["type"] != "prometheus":
        raise ManifestError(f"{path}: the bench reads one prometheus trigger, not {triggers}")
    trigger = triggers[0]
    query = trigger["metadata"]["query"]
    summed = SUM_OF.match(query)
    if summed is None:
        raise ManifestError(f"{path}: the query is not a sum over the pods: {query}")
    advanced = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
    return Keda(
        spec=_spec(
            spec.get("minReplicaCount", 0),
            spec.get("maxReplicaCount", 100),
            advanced.get("behavior"),
        ),
        polling_s=float(spec.get("pollingInterval", KEDA_POLLING_S)),
        metric=summed[1],
        query=query,
        metric_type=trigger.get("metricType", "AverageValue"),
        threshold=quantity(trigger["metadata"]["threshold"]),
    )


def read_hpa(path: Path = HPA) -> Hpa:
    """The HorizontalPodAutoscaler at ``path``; its one metric must be a Pods AverageValue."""
    spec = _load(path, "HorizontalPodAutoscaler")["spec"]
    metrics = spec["metrics"]
    if len(metrics) != 1 or metrics[0]["type"] != "Pods":
        raise ManifestError(f"{path}: the bench reads one Pods metric, not {metrics}")
    pods = metrics[0]["pods"]
    if pods["target"]["type"] != "AverageValue":
        raise ManifestError(f"{path}: the bench reads an AverageValue target, not {pods}")
    return Hpa(
        spec=_spec(spec.get("minReplicas", 1), spec["maxReplicas"], spec.get("behavior")),
        metric=pods["metric"]["name"],
        target=quantity(pods["target"]["averageValue"]),
    )
