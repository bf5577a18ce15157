"""The deploy files' PromQL against a real Prometheus (Debian's `prometheus` and `promtool`).

promtool checks and unit-tests the alerting rules. Then Prometheus scrapes a live sidecar (NVML
through the C double, two GPUs of which SIDECAR_GPUS selects one) in front of the emulated engine,
with streams held open so permits are in use and requests queue, and every query the KEDA
triggers, the prometheus-adapter rules, the alerts and the dashboard run is evaluated as written
in those files, its values checked against the sidecar's own /capacity.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import deploy_files as d
from tests.servers import refused_port
from tests.test_deploy_manifests import PENDING_METRICS

TINY_MODEL = d.ROOT / "tests" / "configs" / "tiny-llama.json"
NVML_DOUBLE = d.ROOT / "tests" / "nvml_double" / "nvml_double.c"
ENGINE_GPU, NEIGHBOUR_GPU = "GPU-engine-0001", "GPU-neighbour-02"
GPUS = f"""gpu 4194304 2097152 2097152 0 1 -1 {ENGINE_GPU} NVIDIA Test GPU
gpu 4194304 1048576 3145728 0 1 -1 {NEIGHBOUR_GPU} NVIDIA Test GPU
proc 0 4242 2097152
proc 1 4343 1048576
"""
# The pod labels a PodMonitor with podTargetLabels [app] gives every series.
POD = {"namespace": "llm", "pod": "llm-test-0", "app": "llm"}
HELD_STREAMS = 5
# Dashboard panels that stay empty in this set-up, and why.
EMPTY_HERE = {
    "sidecar_capacity_disagreement_ratio": "only where the engine's pool and NVML are both read",
    "sidecar_kv_reserved_bytes": "token admission only; this stack runs the default (slo)",
    "sidecar_kv_admissible_bytes": "token admission only; this stack runs the default (slo)",
    **dict.fromkeys(
        (
            "sidecar_adaptive_limit_tokens",
            "sidecar_adaptive_overcommit_ratio",
            "sidecar_adaptive_fallback",
            "sidecar_adaptive_expected_completion_tokens",
            "sidecar_adaptive_completion_samples",
            "sidecar_ledger_tokens",
            "sidecar_ledger_reserved_tokens",
        ),
        "adaptive admission only; this stack runs the default (slo)",
    ),
}
DASHBOARD_VALUES = {
    "namespace": POD["namespace"],
    "pod": ".+",
    "__rate_interval": "10s",
    "ttft_objective": "2",
    "tpot_objective": "0.1",
}
PROMETHEUS_KEY = {  # metric an autoscaler reads -> the /capacity field it must equal
    "sidecar_utilisation": "utilisation",
}

Get = Callable[[str], Any]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


@dataclass
class Stack:
    """A live emulator, sidecar and Prometheus; ``query`` runs PromQL now."""

    admin: str
    prometheus: str

    def capacity(self) -> dict[str, Any]:
        data: dict[str, Any] = get_json(f"{self.admin}/capacity")
        return data

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        answer = get_json(url)
        assert answer["status"] == "success", (promql, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result


class Processes:
    """Processes this module started, stopped by PID in reverse order."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        with log.open("wb") as out:
            self.started.append(
                subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
            )

    def stop(self) -> None:
        for process in reversed(self.started):
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def hold_stream(port: int) -> socket.socket:
    """Open a streaming completion through the proxy and leave it running (never read)."""
    body = json.dumps(
        {
            "model": "emulated-llama",
            "messages": [{"role": "user", "content": "hold this stream open " * 8}],
            "max_tokens": 150,
            "stream": True,
        }
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def prometheus_config(admin_port: int, engine_port: int, rules: Path) -> dict[str, Any]:
    """The scrapes the rendered PodMonitor describes, one per endpoint (the admin port, vLLM's
    own port), with its metric relabelings, on the local ports standing in for the pod's."""
    ports = {"admin": admin_port, "engine": engine_port}
    monitor = d.only(d.render("overlays/device-plugin-keda"), "PodMonitor")
    scrapes = []
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        relabel = [
            {"source_labels": r["sourceLabels"], "regex": r["regex"], "action": r["action"]}
            for r in endpoint.get("metricRelabelings", [])
        ]
        scrapes.append(
            {
                "job_name": endpoint["port"],
                "metrics_path": endpoint["path"],
                "static_configs": [
                    {"labels": POD, "targets": [f"127.0.0.1:{ports[endpoint['port']]}"]}
                ],
                "metric_relabel_configs": relabel,
            }
        )
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": scrapes,
    }


def write_rules(path: Path, *, annotations: bool = True) -> Path:
    groups = d.rule_groups(d.render("overlays/device-plugin-keda"))
    if not annotations:
        for group in groups["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
    path.write_text(yaml.safe_dump(groups))
    return path


def sidecar_env(upstream: str, proxy_port: int, admin_port: int, double: Path) -> dict[str, str]:
    return {
        **os.environ,
        "LD_LIBRARY_PATH": str(double.parent),
        "NVML_DOUBLE_SCRIPT": str(double.parent / "gpus.txt"),
        "SIDECAR_UPSTREAM_URL": upstream,
        "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_ADMIN_HOST": "127.0.0.1",
        "SIDECAR_PORT": str(proxy_port),
        "SIDECAR_ADMIN_PORT": str(admin_port),
        "SIDECAR_CAPACITY_SOURCE": "nvml",
        "SIDECAR_GPUS": ENGINE_GPU,
        "SIDECAR_MODEL": str(TINY_MODEL),
        "SIDECAR_WEIGHTS": "1MiB",
        "SIDECAR_OVERHEAD": "512KiB",
        "SIDECAR_SAFETY_FACTOR": "0.2",
        "SIDECAR_MAX_PROMPT_TOKENS": "100",
        "SIDECAR_MAX_COMPLETION_TOKENS": "156",
        "SIDECAR_MAX_QUEUE": "8",
        "SIDECAR_MAX_WAIT_MS": "120000",
        # The default admission waits no longer than the TTFT objective: held streams must queue.
        "SIDECAR_SLO_TTFT_MS": "120000",
        # The engine runs 2 tokens a second: a pod healthy at that pace is held to it (the
        # signal hears the running streams' pace).
        "SIDECAR_SLO_TPOT_MS": "2000",
        "SIDECAR_LOG_LEVEL": "warning",
    }


def build_double(out: Path) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        if os.environ.get("CI") == "true":
            pytest.fail("gcc is needed to build the NVML double; .ci/run must install it")
        pytest.skip("gcc is needed to build the NVML double")
    library = out / "libnvidia-ml.so.1"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(library), str(NVML_DOUBLE)], check=True)
    (out / "gpus.txt").write_text(GPUS)
    return library


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Emulator, sidecar with held streams, and a Prometheus scraping them every second."""
    prometheus = d.require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus-stack")
    double = build_double(tmp)
    # Held until the stack stops: four distinct ports that no other bind(0) is handed meanwhile.
    held = contextlib.ExitStack()
    engine, proxy, admin, web = (held.enter_context(refused_port()) for _ in range(4))
    processes, streams = Processes(), []
    try:
        processes.start(
            [sys.executable, "-m", "emulator", "--port", str(engine), "--tokens-per-s", "2"],
            tmp / "emulator.log",
        )
        wait_for(lambda: bool(get_json(f"http://127.0.0.1:{engine}/v1/models")), "the emulator")
        env = sidecar_env(f"http://127.0.0.1:{engine}", proxy, admin, double)
        processes.start([sys.executable, "-m", "sidecar", "serve"], tmp / "sidecar.log", env)
        live = Stack(admin=f"http://127.0.0.1:{admin}", prometheus=f"http://127.0.0.1:{web}")
        wait_for(lambda: live.capacity()["limit"] > 0, "the sidecar's first plan")
        streams = [hold_stream(proxy) for _ in range(HELD_STREAMS)]
        wait_for(
            lambda: live.capacity()["in_use"] + live.capacity()["queued"] == HELD_STREAMS,
            "the held streams to be admitted or queued",
        )
        config = tmp / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(prometheus_config(admin, engine, write_rules(tmp / "r.yml")))
        )
        processes.start(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            tmp / "prometheus.log",
        )
        wait_for(lambda: len(live.query("up == 1")) == 2, "Prometheus to scrape both targets", 30.0)
        yield live
    finally:
        for sock in streams:
            sock.close()
        processes.stop()
        held.close()


def value(result: list[dict[str, Any]]) -> float:
    (sample,) = result
    return float(sample["value"][1])


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    """`promtool check rules` on the PrometheusRule's groups, annotations' templates included."""
    done = subprocess.run(
        [d.require_tool("promtool"), "check", "rules", str(write_rules(tmp_path / "rules.yml"))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(d.alert_rules(d.render('overlays/device-plugin-keda')))} rules" in (
        done.stdout
    )


def test_promtool_unit_tests_of_the_alerts(tmp_path: Path) -> None:
    """Each alert fires for the pod in trouble, after its `for`, and not for its healthy twin."""
    tests = yaml.safe_load((d.ROOT / "tests" / "prometheus" / "alerts.test.yaml").read_text())
    # Annotations are checked by `promtool check rules`; here the labels and timing are.
    tests["rule_files"] = [str(write_rules(tmp_path / "rules.yml", annotations=False))]
    tested = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"]}
    assert tested == {r["alert"] for r in d.alert_rules(d.render("overlays/device-plugin-keda"))}
    (tmp_path / "alerts.test.yaml").write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        [d.require_tool("promtool"), "test", "rules", str(tmp_path / "alerts.test.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_loaded_every_alert(stack: Stack) -> None:
    """The rule file from the PrometheusRule loads and every rule evaluates healthily."""
    expected = {r["alert"] for r in d.alert_rules(d.render("overlays/device-plugin-keda"))}

    def loaded() -> bool:
        groups = get_json(f"{stack.prometheus}/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return {r["name"] for r in rules} == expected and all(r["health"] == "ok" for r in rules)

    wait_for(loaded, "every rule to be evaluated")


def settled(stack: Stack, promql: str, field: str) -> tuple[float, float]:
    """(Prometheus' value, /capacity's field) once they agree, or as they are at the deadline."""
    deadline = time.monotonic() + 15
    while True:
        expected = float(stack.capacity()[field])
        result = stack.query(promql)
        if (result and math.isclose(value(result), expected, abs_tol=1e-3)) or (
            time.monotonic() > deadline
        ):
            return value(result), expected
        time.sleep(0.2)


def test_keda_triggers_read_the_sidecar_state(stack: Stack) -> None:
    """Each trigger's query, as written, equals what /capacity says (utilisation, queue)."""
    queries = d.keda_queries(d.render("overlays/device-plugin-keda"))
    assert stack.capacity()["queued"] > 0
    assert stack.capacity()["utilisation"] > 0
    for name, query in queries.items():
        (metric,) = d.metric_names(query)
        got, expected = settled(stack, query, PROMETHEUS_KEY[metric])
        assert got == pytest.approx(expected, abs=1e-3), name


def test_adapter_rules_give_each_pod_its_value(stack: Stack) -> None:
    """The adapter's metricsQuery, its template filled as for this pod, equals /capacity."""
    rules = d.adapter_rules(d.render("overlays/dra-hpa"))
    matchers = f'namespace="{POD["namespace"]}",pod=~"{POD["pod"]}"'
    for rule in rules:
        assert stack.query(rule["seriesQuery"]), rule["seriesQuery"]
        metric, query = d.adapter_query(rule, matchers, "pod")
        got, expected = settled(stack, query, PROMETHEUS_KEY[metric])
        assert got == pytest.approx(expected, abs=1e-3), metric
        assert stack.query(query)[0]["metric"] == {"pod": POD["pod"]}


def test_alerts_stay_quiet_on_a_healthy_sidecar(stack: Stack) -> None:
    """Every alert expr evaluates; while permits are in use, the engine runs and requests queue
    at the sidecar well within their TTFT objective (120 s here), no alert's condition holds: a
    queue that serves its requests within the objectives is not saturation."""
    running = stack.query('sum(vllm:num_requests_running{namespace="llm"})')
    assert value(running) > 0  # the engine's metrics arrive from its own port
    assert stack.capacity()["queued"] > 0
    holding = {
        rule["alert"]
        for rule in d.alert_rules(d.render("overlays/device-plugin-keda"))
        if stack.query(rule["expr"])
    }
    assert stack.capacity()["utilisation"] < 1
    assert holding == set()


def test_dashboard_queries_return_data(stack: Stack) -> None:
    """Every panel's query runs; each returns series unless its metric is pending or needs
    what this set-up lacks (both listed, with the reason)."""
    allowed_empty = set(EMPTY_HERE) | set(PENDING_METRICS)
    for title, expr in d.dashboard_targets(d.dashboard()):
        promql = d.fill_dashboard_variables(expr, DASHBOARD_VALUES)
        assert "$" not in promql, promql
        if d.metric_names(expr) & allowed_empty:
            stack.query(promql)  # still has to be valid PromQL
            continue
        # rate() needs two scrapes inside its window: poll rather than sleep.
        wait_for(partial(has_data, stack, promql), f"data for panel {title!r}: {promql}")


def has_data(stack: Stack, promql: str) -> bool:
    return bool(stack.query(promql))


def test_gpu_series_name_only_the_engine_gpu(stack: Stack) -> None:
    """SIDECAR_GPUS picks the engine's GPU by UUID: the neighbour never shows up."""
    result = stack.query('sidecar_gpu_memory_total_bytes{namespace="llm"}')
    assert {r["metric"]["gpu"] for r in result} == {ENGINE_GPU}
    assert [g["uuid"] for g in stack.capacity()["capacity"]["gpus"]] == [ENGINE_GPU]
