"""The admin port: /capacity, /metrics, /healthz, /readyz. Never served on the proxy port."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sidecar.limiter.bulkhead import Bulkhead
from sidecar.live.adaptive import AdaptiveCapacity
from sidecar.live.control_loop import CapacityController
from sidecar.telemetry.adaptive_metrics import adaptive_json
from sidecar.telemetry.capacity_metrics import capacity_json


@dataclass(frozen=True)
class Admin:
    """What the admin handlers read; all of it is read at request time."""

    bulkhead: Bulkhead
    controller: CapacityController
    registry: CollectorRegistry
    clock: Callable[[], float]
    draining: Callable[[], bool]
    loop_alive: Callable[[], bool]
    adaptive: AdaptiveCapacity | None = None


ADMIN = web.AppKey("admin", Admin)


def build_admin_app(admin: Admin) -> web.Application:
    app = web.Application()
    app[ADMIN] = admin
    app.router.add_get("/capacity", capacity)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def capacity_document(admin: Admin) -> dict[str, Any]:
    """Permits and queue now, the plan with every term's source and age, the live readings."""
    now = admin.clock()
    snap = admin.bulkhead.snapshot()
    state = capacity_json(admin.controller.state, admin.controller.requested_source, now)
    plan = state.get("plan") or {}
    utilisation = snap.in_use_cost / snap.limit if snap.limit else float(snap.in_use_cost > 0)
    return {
        "admission": snap.mode,
        "shadow": snap.shadow,
        "draining": admin.draining(),
        "permits": state["limit"] if snap.mode == "count" else plan.get("permits"),
        "limit": snap.limit,
        "in_use": snap.in_use,
        "in_use_cost": snap.in_use_cost,
        "queued": snap.queued,
        "utilisation": round(utilisation, 4),
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
        "engine_kv_usage_ratio": (state["engine"] or {}).get("kv_usage_ratio"),
        "adaptive": adaptive_json(admin.adaptive, snap) if admin.adaptive is not None else None,
        "compartments": [asdict(part) for part in snap.compartments],
        "counters": {
            "granted": snap.granted_total,
            "queued": snap.queued_total,
            "rejected": snap.rejected,
            "released": snap.released,
        },
        "capacity": state,
    }


async def capacity(request: web.Request) -> web.Response:
    return web.json_response(capacity_document(request.app[ADMIN]))


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[ADMIN].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    """Alive while the capacity loop runs; a dead loop means a restart is the fix."""
    if not request.app[ADMIN].loop_alive():
        return web.json_response({"status": "capacity loop stopped"}, status=503)
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Not ready while draining or with no capacity at all (the reason says why); ready but
    saying so while running on a stale plan or the floor."""
    admin = request.app[ADMIN]
    state = admin.controller.state
    ready = not admin.draining() and state.available
    body: dict[str, Any] = {"ready": ready, "draining": admin.draining(), "capacity": state.mode}
    if not state.available:
        body["reason"] = next(w.message for w in state.warnings if w.code == "no_capacity")
    return web.json_response(body, status=200 if ready else 503)
