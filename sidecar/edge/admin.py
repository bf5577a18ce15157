"""The admin port: /capacity, /metrics, /healthz, /readyz. Never served on the proxy port.

Served by the same HTTP/1.1 server side as the proxy port (sidecar.edge.http.server), with its own
connection cap: GET and HEAD only; any other path is a JSON 404, any other method a 405.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sidecar.core.admission.decisions import LIMIT_UNITS, MODES
from sidecar.core.admission.modes import AdmissionMode
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Response
from sidecar.edge.http.server import Handler
from sidecar.edge.openai_errors import json_error
from sidecar.limiter.bulkhead import Bulkhead
from sidecar.limiter.events import BulkheadSnapshot
from sidecar.live.control_loop import CapacityController
from sidecar.telemetry.capacity_metrics import capacity_json
from sidecar.telemetry.metrics import limit_utilisation
from sidecar.telemetry.saturation_metrics import SaturationSignal


@dataclass(frozen=True, kw_only=True)
class Admin:
    """What the admin handlers read; all of it is read at request time."""

    bulkhead: Bulkhead
    controller: CapacityController
    registry: CollectorRegistry
    clock: Callable[[], float]
    draining: Callable[[], bool]
    loop_alive: Callable[[], bool]
    mode: AdmissionMode
    signal: SaturationSignal | None = None


def admin_handler(admin: Admin) -> Handler:
    """Every request on the admin port, routed on its path (a query string is ignored)."""
    routes: dict[str, Callable[[Admin], Response]] = {
        "/capacity": capacity,
        "/metrics": metrics,
        "/healthz": healthz,
        "/readyz": readyz,
    }

    async def handle(request: Request) -> Response:
        route = routes.get(request.raw_path.partition("?")[0])
        if route is None:
            message = "no such admin endpoint; see /capacity, /metrics, /healthz, /readyz"
            return json_error(404, message, type_="invalid_request_error", code="not_found")
        if request.method not in ("GET", "HEAD"):
            message, allow = "the admin endpoints answer GET and HEAD only", {"Allow": "GET, HEAD"}
            code = "method_not_allowed"
            return json_error(405, message, type_="invalid_request_error", code=code, headers=allow)
        return route(admin)

    return handle


def json_response(body: dict[str, Any], status: int = 200) -> Response:
    return Response(status, json.dumps(body).encode(), content_type="application/json")


def capacity_document(admin: Admin) -> dict[str, Any]:
    """Permits and queue now, the plan with every term's source and age, the live readings."""
    now = admin.clock()
    snap = admin.bulkhead.snapshot()
    state = capacity_json(admin.controller.state, admin.controller.requested_source, now)
    plan = state.get("plan") or {}
    saturation = admin.signal.read() if admin.signal is not None else None
    return {
        "admission": snap.mode,
        "shadow": snap.shadow,
        "draining": admin.draining(),
        "permits": state["limit"] if MODES[snap.mode].counts_requests else plan.get("permits"),
        "worst_case_permits": plan.get("permits"),
        "limit": snap.limit,
        "limit_unit": LIMIT_UNITS[snap.mode],
        "in_use": snap.in_use,
        "in_use_cost": snap.in_use_cost,
        **side_by_side(snap, admin.bulkhead.in_flight_limit),
        "queued": snap.queued,
        "utilisation": None if saturation is None else round(saturation.utilisation, 4),
        "saturation": None if saturation is None else saturation.to_dict(),
        "limit_utilisation": round(limit_utilisation(snap), 4),
        "kv_bytes_per_token": plan.get("kv_bytes_per_token"),
        "kv_pool_bytes": plan.get("kv_pool_bytes"),
        "kv_pool_tokens": plan.get("kv_pool_tokens"),
        "request_max_tokens": plan.get("request_max_tokens"),
        "request_max_bytes": plan.get("request_max_bytes"),
        "source": state["source"],
        "stale": state["stale"],
        "on_floor": state["on_floor"],
        "plan_age_s": state["plan_age_s"],
        "warnings": state["warnings"],
        "served_model": state["served_model"],
        "engine": (state["engine"] or {}).get("engine"),
        "engine_slots": (state["engine"] or {}).get("slots"),
        "budget": admin.controller.token_budget.to_dict(),
        "engine_kv_usage_ratio": (state["engine"] or {}).get("kv_usage_ratio"),
        "adaptive": None,
        "slo": None,
        **admin.mode.document(snap),
        "compartments": [asdict(part) for part in snap.compartments],
        "counters": {
            "granted": snap.granted_total,
            "queued": snap.queued_total,
            "rejected": snap.rejected,
            "released": snap.released,
        },
        "capacity": state,
    }


def side_by_side(snap: BulkheadSnapshot, in_flight_limit: int | None) -> dict[str, Any]:
    """The limits in force beside what is held of each, one unit each: ``in_flight`` (every
    request admitted and not ended), and in slo admission ``starting`` (streams admitted and not
    yet at their first token, which its limit counts), else null."""
    if not MODES[snap.mode].limits_starts:
        unit = LIMIT_UNITS[snap.mode]
        in_flight = {"unit": unit, "limit": snap.limit, "in_use": snap.in_use_cost}
        return {"in_flight": in_flight, "starting": None}
    return {
        "in_flight": {"unit": "requests", "limit": in_flight_limit, "in_use": snap.in_use},
        "starting": {"unit": "streams", "limit": snap.limit, "in_use": snap.in_use_cost},
    }


def capacity(admin: Admin) -> Response:
    return json_response(capacity_document(admin))


def metrics(admin: Admin) -> Response:
    return Response(200, generate_latest(admin.registry), content_type=CONTENT_TYPE_LATEST)


def healthz(admin: Admin) -> Response:
    """Alive while the capacity loop runs; a dead loop means a restart is the fix."""
    if not admin.loop_alive():
        return json_response({"status": "capacity loop stopped"}, status=503)
    return json_response({"status": "ok"})


def readyz(admin: Admin) -> Response:
    """Ready means able to serve: not while draining, with no capacity at all, or before the
    engine has answered and while it does not (judged from the age of its last good reading);
    the reason says why. Ready but saying so while running on a stale plan or the floor."""
    state = admin.controller.state
    engine = admin.controller.engine_unready()
    reasons = [
        *(["draining: the sidecar is shutting down"] if admin.draining() else []),
        *(w.message for w in state.warnings if w.code == "no_capacity"),
        *([engine] if engine is not None else []),
    ]
    ready = not reasons
    body: dict[str, Any] = {
        "ready": ready,
        "draining": admin.draining(),
        "capacity": state.mode,
    }
    if reasons:
        body["reason"] = "; ".join(reasons)
    return json_response(body, status=200 if ready else 503)
