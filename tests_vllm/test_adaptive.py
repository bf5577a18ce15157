"""Adaptive admission against the real vLLM: completions that stop long before max_tokens let an
adaptive sidecar (zero-config, started here) run more streams at once than the script's sidecar,
which prices every request at its worst case (2 permits) on the same budget and alpha, while
vLLM's own preemption counter stays flat."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import scrape
from conftest import Stack

EOS_TOKEN_ID = 2  # scripts/build_tiny_model.py trains </s> as id 2
LENGTH = 24  # min_tokens, then a strong EOS bias: every completion is this long
MAX_TOKENS = 400
BURST = 8
POLL_S = 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def adaptive_sidecar(stack: Stack) -> Iterator[tuple[str, str]]:
    """A second sidecar, SIDECAR_ADMISSION=adaptive and no SIDECAR_MODEL, stopped by its PID."""
    port, admin = _free_port(), _free_port()
    env = {
        **os.environ,
        "SIDECAR_UPSTREAM_URL": stack.vllm_url, "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_PORT": str(port), "SIDECAR_ADMIN_HOST": "127.0.0.1",
        "SIDECAR_ADMIN_PORT": str(admin), "SIDECAR_CAPACITY_SOURCE": "vllm",
        "SIDECAR_ADMISSION": "adaptive", "SIDECAR_ADAPTIVE_MIN_SAMPLES": "4",
        "SIDECAR_MAX_PROMPT_TOKENS": str(stack.max_prompt_tokens),
        "SIDECAR_MAX_COMPLETION_TOKENS": str(stack.max_completion_tokens),
        "SIDECAR_SAFETY_FACTOR": str(stack.safety_factor), "SIDECAR_REFRESH_MS": "250",
        "SIDECAR_MAX_WAIT_MS": "20000",
    }  # fmt: skip
    sidecar = str(Path(sys.executable).with_name("sidecar"))
    proc = subprocess.Popen(
        [sidecar, "serve"], env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _body(stack: Stack, index: int) -> dict[str, Any]:
    return {
        "model": stack.served_model,
        "prompt": f"Client {index} asks about the weather.",
        "max_tokens": MAX_TOKENS,
        "min_tokens": LENGTH,
        "logit_bias": {str(EOS_TOKEN_ID): 100},
        "stream": True,
    }


async def _stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    """Relay one stream; returns the HTTP status (200 also for an SSE busy answer)."""
    async with http.post(f"{url}/v1/completions", json=body) as response:
        await response.read()
        return response.status


async def _peak_in_use(http: aiohttp.ClientSession, admin: str, done: asyncio.Event) -> int:
    peak = 0
    while not done.is_set():
        peak = max(peak, (await scrape.capacity(http, admin))["in_use"])
        await asyncio.sleep(POLL_S)
    return peak


async def _burst(http: aiohttp.ClientSession, stack: Stack, url: str, admin: str) -> int:
    done = asyncio.Event()
    watcher = asyncio.create_task(_peak_in_use(http, admin, done))
    await asyncio.gather(*(_stream(http, url, _body(stack, i)) for i in range(BURST)))
    done.set()
    return await watcher


async def _until_ready(http: aiohttp.ClientSession, admin: str) -> None:
    for _ in range(200):
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with http.get(f"{admin}/readyz") as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.1)
    pytest.fail("the adaptive sidecar did not become ready")


async def _preemptions(http: aiohttp.ClientSession, stack: Stack) -> float:
    text = await scrape.fetch_text(http, f"{stack.vllm_url}/metrics")
    return scrape.total(text, "vllm:num_preemptions_total", default=0.0)


async def test_adaptive_runs_more_streams_without_preemption(
    stack: Stack, http: aiohttp.ClientSession
) -> None:
    """Same budget and alpha: worst-case pricing holds 2 streams, adaptive more; 0 preemptions."""
    with adaptive_sidecar(stack) as (url, admin):
        await _until_ready(http, admin)
        for index in range(5):  # learn: every completion stops at LENGTH tokens
            assert await _stream(http, url, _body(stack, index)) == 200
        doc = await scrape.capacity(http, admin)
        (learned,) = doc["adaptive"]["expected_completion_tokens"]
        assert learned["tokens"] <= LENGTH + 2, learned  # role/usage events aside
        assert doc["served_model"] == stack.served_model
        assert doc["warnings"] == []
        before = await _preemptions(http, stack)
        adaptive_peak = await _burst(http, stack, url, admin)
        worst_case_peak = await _burst(http, stack, stack.sidecar_url, stack.admin_url)
        after = await _preemptions(http, stack)
    print(f"peak streams in flight: adaptive {adaptive_peak}, worst case {worst_case_peak}")
    assert worst_case_peak <= 2
    assert adaptive_peak > worst_case_peak
    assert after == before
