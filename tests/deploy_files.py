"""What the tests read out of deploy/: kustomize renderings and the PromQL inside them.

Every query the tests run comes from the manifests and the dashboard themselves, never a copy.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).parent.parent
K8S = ROOT / "deploy" / "k8s"
DASHBOARD = ROOT / "deploy" / "grafana" / "sidecar-dashboard.json"
RENDERINGS = (
    "base",
    "overlays/device-plugin-keda",
    "overlays/dra-hpa",
    "overlays/inference-gateway",
    "overlays/tensor-parallel",
)
OVERLAYS = RENDERINGS[1:]
KUBERNETES_VERSION = "1.34.0"  # resource.k8s.io/v1 (DRA) and the preStop sleep action are GA here
METRIC = re.compile(r"\b(?:sidecar_[a-z_]+|vllm:[a-z_]+)")

Doc = dict[str, Any]


def require_tool(name: str) -> str:
    """The tool's path (this venv's bin first: hadolint comes as a wheel); skipped where it is
    missing, except under CI, where that is a failure."""
    path = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.defpath}")
    path = path or shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed; .ci/run must install it")
        pytest.skip(f"{name} is not installed")
    return path


@functools.cache
def _render(target: str) -> tuple[Doc, ...]:
    done = subprocess.run(
        [require_tool("kubectl"), "kustomize", str(K8S / target)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def render(target: str) -> list[Doc]:
    """The documents ``kubectl kustomize deploy/k8s/<target>`` prints (rendered once per run)."""
    return list(_render(target))


def only(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    """The single document of ``kind`` (and ``name``) in a rendering."""
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in found])
    return found[0]


def pod_spec(docs: list[Doc]) -> Doc:
    spec: Doc = only(docs, "Deployment", "llm")["spec"]["template"]["spec"]
    return spec


def container(docs: list[Doc], name: str) -> Doc:
    return next(c for c in pod_spec(docs)["containers"] if c["name"] == name)


def sidecar_env(docs: list[Doc]) -> dict[str, str]:
    """The sidecar's environment as the kubelet builds it: envFrom ConfigMaps, then env."""
    env: dict[str, str] = {}
    side = container(docs, "sidecar")
    for source in side.get("envFrom", []):
        env |= only(docs, "ConfigMap", source["configMapRef"]["name"])["data"]
    env |= {item["name"]: _env_value(side, item) for item in side.get("env", [])}
    return env


BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _env_value(side: Doc, item: Doc) -> str:
    """A literal value, or a resourceFieldRef resolved as the kubelet does (a memory limit in
    bytes: its divisor defaults to 1)."""
    if "value" in item:
        return str(item["value"])
    ref = item["valueFrom"]["resourceFieldRef"]
    kind, resource = ref["resource"].split(".")
    quantity = str(side["resources"][kind][resource])
    suffix = quantity[-2:]
    if suffix in BINARY_SUFFIXES:
        return str(int(quantity[:-2]) * BINARY_SUFFIXES[suffix])
    return quantity


def keda_queries(docs: list[Doc]) -> dict[str, str]:
    """Trigger name -> the PromQL of each prometheus trigger of the ScaledObject."""
    triggers = only(docs, "ScaledObject")["spec"]["triggers"]
    return {t["name"]: t["metadata"]["query"] for t in triggers if t["type"] == "prometheus"}


def adapter_rules(docs: list[Doc]) -> list[Doc]:
    """The prometheus-adapter rules of the HPA component's ConfigMap."""
    config = only(docs, "ConfigMap", "prometheus-adapter-llm-rules")["data"]["config.yaml"]
    rules: list[Doc] = yaml.safe_load(config)["rules"]
    return rules


def adapter_query(rule: Doc, label_matchers: str, group_by: str) -> tuple[str, str]:
    """(metric the HPA names, the rule's metricsQuery as the adapter fills in its template)."""
    series = rule["name"]["matches"].strip("^$")
    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", label_matchers)
        .replace("<<.GroupBy>>", group_by)
    )
    return rule["name"]["as"], query


def alert_rules(docs: list[Doc]) -> list[Doc]:
    """Every alerting rule of the rendering's PrometheusRule."""
    spec = only(docs, "PrometheusRule")["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule]


def rule_groups(docs: list[Doc]) -> Doc:
    """The PrometheusRule's spec: a plain Prometheus rule file."""
    spec: Doc = only(docs, "PrometheusRule")["spec"]
    return spec


def dashboard() -> Doc:
    data: Doc = json.loads(DASHBOARD.read_text())
    return data


def dashboard_targets(board: Doc) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel, rows' nested panels included."""
    found = []
    for panel in board["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            found += [(inner["title"], t["expr"]) for t in inner.get("targets", [])]
    return found


def fill_dashboard_variables(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana's $variables (longest name first) as Grafana would before querying."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${name}", values[name])
    return expr


def epp_metric_flags(docs: list[Doc]) -> dict[str, str]:
    """The endpoint picker's --*-metric flags and their values (empty: turned off)."""
    epp = only(docs, "Deployment", "llm-epp")["spec"]["template"]["spec"]["containers"][0]
    return dict(arg.removeprefix("--").split("=", 1) for arg in epp["args"])


def metric_names(promql: str) -> set[str]:
    """The sidecar_* and vllm:* metric names a query reads."""
    return set(METRIC.findall(promql))
