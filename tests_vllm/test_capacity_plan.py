"""The sidecar's capacity plan agrees with the numbers the real vLLM states for its KV cache."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import aiohttp
import scrape
from conftest import Stack

# The tiny Llama: 2 (K and V) x 2 layers x 2 KV heads x head_dim 32 x 4 bytes (float32).
TINY_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4
# What matters of the config vLLM 0.32 served when the fixtures in the brief were captured.
TINY_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 3,
    "tie_word_embeddings": False,
}


async def _engine_cache(stack: Stack, http: aiohttp.ClientSession) -> dict[str, str]:
    return scrape.cache_config(await scrape.fetch_text(http, f"{stack.vllm_url}/metrics"))


async def _capacity(stack: Stack, http: aiohttp.ClientSession) -> dict[str, Any]:
    """/capacity once its plan is fresh; fails if it stays stale for 10 s.

    A probe that timed out on a starved CPU marks the plan stale until the next one succeeds.
    """
    deadline = asyncio.get_running_loop().time() + 10.0
    while True:
        body = await scrape.capacity(http, stack.admin_url)
        if body["stale"] is False:
            return body
        assert asyncio.get_running_loop().time() < deadline, f"plan still stale: {body}"
        await asyncio.sleep(0.2)


async def _sidecar_plan(*args: str) -> dict[str, Any]:
    sidecar = Path(sys.executable).with_name("sidecar")
    process = await asyncio.create_subprocess_exec(
        str(sidecar), "plan", *args, "--json", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, f"sidecar plan {' '.join(args)} failed"
    plan: dict[str, Any] = json.loads(out)
    return plan


async def test_engine_runs_the_configured_kv_cache(
    stack: Stack, http: aiohttp.ClientSession
) -> None:
    """vLLM sized its cache from --kv-cache-memory-bytes at the tiny model's 1 KiB per token."""
    cache = await _engine_cache(stack, http)
    assert int(cache["kv_cache_memory_bytes"]) == stack.kv_cache_bytes
    assert int(cache["kv_cache_size_tokens"]) == stack.kv_cache_bytes // TINY_BYTES_PER_TOKEN


async def test_capacity_pool_matches_vllm(stack: Stack, http: aiohttp.ClientSession) -> None:
    """/capacity shows vLLM's own KV pool, in bytes and in tokens, and the model's bytes/token."""
    cache = await _engine_cache(stack, http)
    capacity = await _capacity(stack, http)
    assert capacity["source"] == "vllm"
    assert capacity["kv_bytes_per_token"] == TINY_BYTES_PER_TOKEN
    assert capacity["kv_pool_bytes"] == int(cache["kv_cache_memory_bytes"])
    assert capacity["kv_pool_tokens"] == int(cache["kv_cache_size_tokens"])


async def test_capacity_permits_follow_the_formula(
    stack: Stack, http: aiohttp.ClientSession
) -> None:
    """The live permit count is floor(pool / (budget x bytes/token) x alpha), as /metrics too."""
    cache = await _engine_cache(stack, http)
    block = int(cache["block_size"])
    budget = math.ceil((stack.max_prompt_tokens + stack.max_completion_tokens) / block) * block
    pool = int(cache["kv_cache_memory_bytes"])
    expected = math.floor(pool / (budget * TINY_BYTES_PER_TOKEN) * stack.safety_factor)
    capacity = await _capacity(stack, http)
    metrics = await scrape.fetch_text(http, f"{stack.admin_url}/metrics")
    assert expected >= 1
    assert capacity["permits"] == expected
    assert scrape.total(metrics, "sidecar_permits_limit") == expected


async def test_plan_command_agrees_with_vllm_concurrency(
    stack: Stack, http: aiohttp.ClientSession
) -> None:
    """`sidecar plan` at budget max_model_len and alpha 1 gives vLLM's max concurrency."""
    cache = await _engine_cache(stack, http)
    plan = await _sidecar_plan(
        *("--model", str(stack.model_dir)),
        *("--kv-pool", cache["kv_cache_memory_bytes"]),
        *("--max-tokens", str(stack.max_model_len)),
        *("--alpha", "1"),
        *("--block-size", cache["block_size"]),
    )
    assert plan["kv_bytes_per_token"] == TINY_BYTES_PER_TOKEN
    assert plan["kv_pool_tokens"] == int(cache["kv_cache_size_tokens"])
    assert plan["permits"] == math.floor(float(cache["kv_cache_max_concurrency"]))


def test_tiny_model_has_the_documented_shape(stack: Stack) -> None:
    """scripts/build_tiny_model.py writes the shape the captured vLLM 0.32 fixtures came from."""
    built = json.loads((stack.model_dir / "config.json").read_text())
    assert {key: built.get(key) for key in TINY_SHAPE} == TINY_SHAPE
