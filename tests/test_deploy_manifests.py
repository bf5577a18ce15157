"""deploy/k8s/: the manifests parse, and what they tell the sidecar is what the sidecar accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings

DEPLOY = Path(__file__).parent.parent / "deploy" / "k8s"


def documents() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(DEPLOY.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
    ]


def sidecar_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = next(d for d in documents() if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "admission-sidecar")
    return pod, container


def test_every_manifest_is_a_named_kubernetes_object() -> None:
    """Each YAML document has apiVersion, kind and a name."""
    docs = documents()
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "ScaledObject", "ServiceMonitor"}
    for doc in docs:
        assert doc["apiVersion"], doc
        assert doc["metadata"]["name"], doc


def test_sidecar_env_is_accepted_by_the_settings() -> None:
    """The deployment's SIDECAR_* variables load without error, ports match the containerPorts."""
    pod, container = sidecar_pod()
    env = {item["name"]: item["value"] for item in container["env"]}
    settings = load_settings(env)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert (ports["proxy"], ports["admin"]) == (settings.port, settings.admin_port)
    assert pod["enableServiceLinks"] is False
    assert pod["terminationGracePeriodSeconds"] > settings.drain_grace_s


def test_probes_point_at_the_admin_endpoints() -> None:
    """Readiness and liveness use /readyz and /healthz on the admin port."""
    _, container = sidecar_pod()
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}


@pytest.mark.parametrize("kind", ["ScaledObject", "HorizontalPodAutoscaler"])
def test_autoscalers_read_metrics_the_sidecar_exports(kind: str) -> None:
    """Every sidecar_* metric an autoscaler names is one the sidecar's /metrics really carries."""
    doc = next(d for d in documents() if d["kind"] == kind)
    wanted = set(re.findall(r"sidecar_[a-z_]+", yaml.safe_dump(doc)))
    assert wanted
    _, container = sidecar_pod()
    env = {item["name"]: item["value"] for item in container["env"]}
    exported = generate_latest(SidecarServer(load_settings(env)).registry).decode()
    assert all(f"\n{name} " in exported for name in wanted), wanted
