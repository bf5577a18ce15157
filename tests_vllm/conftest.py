"""Fixtures for the real-vLLM suite: the vLLM and the sidecar that scripts/test_vllm.sh started.

The servers start once per run, outside pytest, so a crash or a slow start shows in their own
logs and both are stopped by PID in one trap; the tests find them through ``E2E_*`` variables.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import openai
import pytest


@dataclass(frozen=True)
class Stack:
    """Where the servers listen and how scripts/test_vllm.sh configured them."""

    vllm_url: str
    sidecar_url: str
    admin_url: str
    model_dir: Path
    served_model: str
    max_model_len: int
    kv_cache_bytes: int
    max_num_seqs: int
    max_prompt_tokens: int
    max_completion_tokens: int
    safety_factor: float
    max_queue: int
    max_wait_ms: int
    logs: Path  # the script's log folder, printed when the suite fails


def _stack_from(environ: dict[str, str]) -> Stack:
    return Stack(
        vllm_url=environ["E2E_VLLM_URL"],
        sidecar_url=environ["E2E_SIDECAR_URL"],
        admin_url=environ["E2E_ADMIN_URL"],
        model_dir=Path(environ["E2E_MODEL_DIR"]),
        served_model=environ["E2E_SERVED_MODEL"],
        max_model_len=int(environ["E2E_MAX_MODEL_LEN"]),
        kv_cache_bytes=int(environ["E2E_KV_CACHE_BYTES"]),
        max_num_seqs=int(environ["E2E_MAX_NUM_SEQS"]),
        max_prompt_tokens=int(environ["E2E_MAX_PROMPT_TOKENS"]),
        max_completion_tokens=int(environ["E2E_MAX_COMPLETION_TOKENS"]),
        safety_factor=float(environ["E2E_SAFETY_FACTOR"]),
        max_queue=int(environ["E2E_MAX_QUEUE"]),
        max_wait_ms=int(environ["E2E_MAX_WAIT_MS"]),
        logs=Path(environ["E2E_LOGS"]),
    )


@pytest.fixture(scope="session")
def stack() -> Stack:
    """The running servers; the suite is skipped when run outside `make test-vllm`."""
    if "E2E_VLLM_URL" not in os.environ:
        pytest.skip("needs the servers that `make test-vllm` (scripts/test_vllm.sh) starts")
    return _stack_from(dict(os.environ))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client for metrics, /capacity and raw SSE."""
    async with aiohttp.ClientSession() as session:
        yield session


def _client(base_url: str) -> openai.AsyncOpenAI:
    # max_retries=0: a retried busy answer would hide exactly what these tests look for.
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
async def via_sidecar(stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official openai client, pointed at the sidecar."""
    async with _client(stack.sidecar_url) as client:
        yield client


@pytest.fixture
async def direct(stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official openai client, pointed straight at vLLM."""
    async with _client(stack.vllm_url) as client:
        yield client
