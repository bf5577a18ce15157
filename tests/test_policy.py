"""The proxy's policy as serve runs it: what a request costs, and how long it may wait, per mode."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sidecar.core.request.claims import Claims
from sidecar.core.request.request_checks import CheckedRequest
from sidecar.entry.policy import SidecarPolicy
from sidecar.entry.settings import load_settings
from sidecar.entry.wiring import build_controller, build_mode, build_slo
from sidecar.telemetry.metrics import RequestMetrics


def policy(env: dict[str, str]) -> SidecarPolicy:
    settings = load_settings({"SIDECAR_CAPACITY_SOURCE": "vllm", **env})
    slo = build_slo(settings)
    controller = build_controller(settings, lambda _limit: None, slo=slo)
    mode = build_mode(settings, None, str, lambda: controller.cost, slo)
    metrics = RequestMetrics(CollectorRegistry())
    return SidecarPolicy(settings, mode, controller, metrics)


def test_a_request_without_a_budget_costs_one_full_request_in_the_modes_unit() -> None:
    """count: one permit; tokens: the bytes a checked request of the whole budget is priced at."""
    assert policy({"SIDECAR_ADMISSION": "count"}).flat_price() == 1
    tokens = policy({"SIDECAR_ADMISSION": "tokens"})
    budget = tokens.budget()
    full = CheckedRequest(
        body=b"{}",
        stream=False,
        completion_tokens=budget.max_completion_tokens,
        prompt_tokens=budget.max_prompt_tokens,
        sequences=1,
        model=None,
    )
    assert tokens.flat_price() == tokens.price(full, "default")[0] > 1


def test_the_wait_is_the_claims_in_count_mode_and_the_slo_laws_in_slo_mode() -> None:
    """count: a claimed TTL bounds the wait, nothing else does; slo: aim (0.8) x the TTFT
    objective (2 s) bounds it too, and a shorter claimed TTL wins."""
    count = policy({"SIDECAR_ADMISSION": "count"})
    assert count.max_wait_of(Claims()) is None
    assert count.max_wait_of(Claims(ttl_s=5.0)) == 5.0
    slo = policy({"SIDECAR_ADMISSION": "slo"})
    assert slo.max_wait_of(Claims()) == 1.6
    assert slo.max_wait_of(Claims(ttl_s=0.5)) == 0.5
