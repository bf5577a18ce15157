"""The emulated engine's aiohttp application: vLLM's OpenAI routes, /health, /metrics, /tokenize;
as llama.cpp also /props and /slots."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from emulator import llamacpp, tokens
from emulator.config import EmulatorConfig
from emulator.generation import GenerationHandler, error_response
from emulator.kv_pool import KVPool
from emulator.lengths import completion_lengths
from emulator.metrics import build_registry
from emulator.queue_cap import QueueCap
from emulator.runner import EngineRunner, Sleep, StepCost

CONFIG_KEY = web.AppKey("emulator_config", EmulatorConfig)
RUNNER_KEY = web.AppKey("emulator_runner", EngineRunner)
REGISTRY_KEY = web.AppKey("emulator_registry", CollectorRegistry)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(
    config: EmulatorConfig,
    *,
    sleep: Sleep = asyncio.sleep,
    clock: Callable[[], float] = time.time,
    poll_s: float = 0.05,
) -> web.Application:
    """An emulated engine; ``sleep`` paces tokens, ``clock`` stamps ``created`` (wall seconds)."""
    pool = KVPool(
        num_blocks=config.num_gpu_blocks,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        oom=config.fails_on_overflow,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
    runner = EngineRunner(pool, cost=step_cost(config), sleep=sleep, poll_s=poll_s)
    registry = build_registry(config, runner.snapshot)
    middlewares = [count_requests(registry)] if config.engine == "vllm" else []
    app = web.Application(middlewares=middlewares)
    app.on_cleanup.append(lambda _: runner.close())
    app[CONFIG_KEY] = config
    app[RUNNER_KEY] = runner
    app[REGISTRY_KEY] = registry
    lengths = completion_lengths(config)
    cap = QueueCap(config.max_num_queued_reqs)  # shared: vLLM counts every unfinished request
    chat = GenerationHandler("chat", config, runner, clock, poll_s, lengths=lengths, queue_cap=cap)
    completion = GenerationHandler(
        "completion", config, runner, clock, poll_s, lengths=lengths, queue_cap=cap
    )
    app.router.add_post("/v1/chat/completions", chat.handle)
    app.router.add_post("/v1/completions", completion.handle)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    if config.engine == "llamacpp":
        app.router.add_get("/metrics", llamacpp.metrics_handler(pool.snapshot))
    else:
        app.router.add_get("/metrics", _metrics)
    app.router.add_post("/tokenize", _tokenize)
    if config.engine == "llamacpp":
        app.router.add_get("/props", llamacpp.props_handler(config))
        app.router.add_get("/slots", llamacpp.slots_handler(config, pool.snapshot))
    return app


def count_requests(registry: CollectorRegistry) -> Middleware:
    """vLLM's ``http_requests_total`` (prometheus-fastapi-instrumentator's: by route, method and
    status class), counted as each request ends; one that raised, or whose client left while it
    ran, as 5xx. What a benchmark reads to know how many requests reached the engine."""
    counter = Counter(
        "http_requests",
        "Total number of requests by method, status and handler.",
        ("handler", "method", "status"),
        registry=registry,
    )

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        status = "5xx"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            status = f"{exc.status // 100}xx"
            raise
        else:
            status = f"{response.status // 100}xx"
            return response
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "none"
            counter.labels(route, request.method, status).inc()

    return middleware


def step_cost(config: EmulatorConfig) -> StepCost:
    """Engine time per step: a decode step paces each stream at tokens_per_s; every token
    computed in the step (a prompt, a recompute, each decode) adds 1 / prefill_tokens_per_s."""
    decode, prefill = config.tokens_per_s, config.prefill_tokens_per_s
    return StepCost(
        step_s=1.0 / decode if decode > 0 else 0.0,
        token_s=1.0 / prefill if prefill > 0 else 0.0,
    )


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _models(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    model = {
        "id": config.model_name,
        "object": "model",
        "created": 0,
        "owned_by": config.engine,
        "root": config.model_name,
        "parent": None,
        "max_model_len": config.max_model_len,
    }
    return web.json_response({"object": "list", "data": [model]})


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _tokenize(request: web.Request) -> web.Response:
    config = request.app[CONFIG_KEY]
    try:
        body = await request.json()
    except json.JSONDecodeError:
        return error_response(400, "request body is not valid JSON")
    if isinstance(body, dict) and isinstance(body.get("messages"), list):
        ids = tokens.chat_token_ids(body["messages"])
    elif isinstance(body, dict) and isinstance(body.get("prompt"), str):
        ids = tokens.text_token_ids(body["prompt"])
    else:
        return error_response(400, "send a prompt string or a messages list", "prompt")
    return web.json_response(
        {
            "count": len(ids),
            "max_model_len": config.max_model_len,
            "tokens": ids,
            "token_strs": None,
        }
    )
