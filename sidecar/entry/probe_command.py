"""``sidecar probe``: what the sidecar sees right now (GPUs, processes, engine cache) and its plan.

Configured from the same SIDECAR_* variables as ``serve``. When nothing can be read it is an error
like any other: one line on stderr, exit status 2 (docs/cli.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from sidecar.core.admission.decisions import LIMIT_UNITS, MODES, Mode
from sidecar.core.errors import ProbeUnavailableError
from sidecar.core.sizes import format_size
from sidecar.entry.logs import configure_logging
from sidecar.entry.settings import Settings, load_settings
from sidecar.entry.wiring import admission_mode, build_adaptive, build_controller
from sidecar.live.control_loop import CapacityController
from sidecar.telemetry.capacity_metrics import capacity_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json`` for the /capacity document instead of the human-readable summary."""
    parser.add_argument("--json", action="store_true", help="print the /capacity JSON document")


def run(args: argparse.Namespace) -> int:
    """Read every probe once, print what was seen, and the plan that would follow."""
    settings = load_settings()
    # stdout is for the report, which says what the loop's log lines would (once); debug shows them.
    level = "debug" if settings.log_level == "debug" else "critical"
    configure_logging(level, stream=sys.stderr)
    document = asyncio.run(_probe_once(settings))
    blind = document["plan"] is None and not document["gpus"] and document["engine"] is None
    if args.json:
        print(json.dumps(document, indent=2, default=str))  # noqa: T201
    elif not blind:
        print("\n".join(describe(document)))  # noqa: T201
    if blind and not args.json:  # the entry point prints it: one line, exit status 2
        raise ProbeUnavailableError(f"nothing could be read: {document['error']}")
    return 2 if blind else 0


async def _probe_once(settings: Settings) -> dict[str, Any]:
    """One tick of the controller ``serve`` would run, priced in the same admission mode, so the
    limit printed is the one ``serve`` would enforce, in its unit."""
    adaptive = build_adaptive(settings)
    controller: CapacityController = build_controller(
        settings, lambda _limit: None, adaptive=adaptive
    )
    try:
        await controller.refresh()
        doc = capacity_json(controller.state, controller.requested_source, time.monotonic())
    finally:
        await controller.stop()
    mode = admission_mode(settings)
    return {"admission": mode, "limit_unit": LIMIT_UNITS[mode], **doc}


def describe(doc: dict[str, Any]) -> list[str]:
    """The /capacity document as lines a person reads."""
    lines = [f"source: {doc['source']} (asked: {doc['requested_source']}), mode: {doc['mode']}"]
    for gpu in doc["gpus"]:
        lines.append(
            f"GPU {gpu['index']} {gpu['name']} {gpu['uuid']}: "
            f"total {format_size(gpu['total_bytes'])}, used {format_size(gpu['used_bytes'])}, "
            f"free {format_size(gpu['free_bytes'])}"
        )
        lines += [
            f"  pid {p['pid']}: {'?' if p['used_bytes'] is None else format_size(p['used_bytes'])}"
            for p in gpu["processes"]
        ]
    lines += _engine_lines(doc["engine"])
    cache = (doc["engine"] or {}).get("cache")
    if cache:
        lines.append("engine cache: " + ", ".join(f"{k}={v}" for k, v in cache.items()))
    for check in doc["disagreements"]:
        lines.append(f"engine vs NVML on {check['gpu']}: {check['ratio']:.1%} apart")
    for room in doc.get("headroom", []):
        share, left = room["engine_share_bytes"], room["left_free_bytes"]
        lines.append(
            f"headroom on {room['gpu']}: engine share {format_size(share)} "
            f"(x {room['memory_fraction']}) leaves {format_size(left)} free; "
            f"other processes hold {format_size(room['others_bytes'])}"
        )
    plan = doc["plan"]
    if plan:
        for term in plan["terms"]:
            lines.append(f"  {term['name']}: {format_size(term['bytes'])} [{term['source']}]")
        lines.append(
            f"plan: {plan['permits']} permits (worst-case requests); KV pool "
            f"{format_size(plan['kv_pool_bytes'])}, {plan['kv_bytes_per_token']:,} B/token, "
            f"request max {plan['request_max_tokens']} tokens = "
            f"{format_size(plan['request_max_bytes'])}"
        )
    if "admission" in doc:
        lines.append(_limit_line(doc))
    lines += [f"warning {w['code']}: {w['message']}" for w in doc.get("warnings", [])]
    if doc["error"]:
        lines.append(f"error: {doc['error']}")
    return lines


def _limit_line(doc: dict[str, Any]) -> str:
    """The limit ``serve`` would enforce, in its unit, and whether the permits are it."""
    unit = str(doc["limit_unit"]).replace("_", " ")
    mode: Mode = doc["admission"]
    return f"admission: {mode}, limit {doc['limit']:,} {unit}{MODES[mode].note}"


def _engine_lines(engine: dict[str, Any] | None) -> list[str]:
    """Which engine answered, its model, and the limits it states (slots: llama.cpp's -np)."""
    if engine is None:
        return []
    said = {
        "model": engine.get("served_model"),
        "max_model_len": engine.get("max_model_len"),
        "slots": engine.get("slots"),
        "running": engine.get("requests_running"),
        "waiting": engine.get("requests_waiting"),
    }
    facts = ", ".join(f"{k}={v}" for k, v in said.items() if v is not None)
    return [f"engine: {engine['engine']}" + (f" ({facts})" if facts else "")]
