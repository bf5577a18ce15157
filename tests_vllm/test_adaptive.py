"""Adaptive admission (SIDECAR_ADMISSION=adaptive) against the real vLLM: completions that stop
long before max_tokens let an adaptive sidecar (zero-config otherwise, started here) run more
streams at once than the script's sidecar, which prices every request at its worst case (2
permits) on the same budget and alpha, while vLLM's own preemption counter stays flat."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import scrape
from conftest import Stack

EOS_TOKEN_ID = 2  # scripts/build_tiny_model.py trains </s> as id 2
# min_tokens, then a strong EOS bias: every completion is this long. Long enough that the burst's
# streams overlap at the engine however late a loaded CPU sends them (24 once read as 1 at once).
LENGTH = 48
MAX_TOKENS = 400
BURST = 8
POLL_S = 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def adaptive_sidecar(stack: Stack) -> Iterator[tuple[str, str]]:
    """A second sidecar with adaptive admission and no SIDECAR_MODEL, stopped by its PID."""
    port, admin = _free_port(), _free_port()
    env = {
        **os.environ,
        "SIDECAR_UPSTREAM_URL": stack.vllm_url, "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_PORT": str(port), "SIDECAR_ADMIN_HOST": "127.0.0.1",
        "SIDECAR_ADMIN_PORT": str(admin), "SIDECAR_CAPACITY_SOURCE": "vllm",
        "SIDECAR_ADAPTIVE_MIN_SAMPLES": "4",
        "SIDECAR_MAX_PROMPT_TOKENS": str(stack.max_prompt_tokens),
        "SIDECAR_MAX_COMPLETION_TOKENS": str(stack.max_completion_tokens),
        "SIDECAR_SAFETY_FACTOR": str(stack.safety_factor), "SIDECAR_REFRESH_MS": "250",
        "SIDECAR_MAX_WAIT_MS": "20000",
    }  # fmt: skip
    env["SIDECAR_ADMISSION"] = "adaptive"
    sidecar = str(Path(sys.executable).with_name("sidecar"))
    # Its log beside the script's two, which scripts/test_vllm.sh prints when the suite fails.
    with (stack.logs / "adaptive-sidecar.log").open("wb") as out:
        proc = subprocess.Popen(
            [sidecar, "serve"], env=env, start_new_session=True, stdout=out, stderr=out
        )
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
        # Longer than 8 tokens, so that no prefill step reads as a decode step (scrape.py).
        "prompt": f"Client {index} asks about the weather today, tomorrow and the day after.",
        "max_tokens": MAX_TOKENS,
        "min_tokens": LENGTH,
        "logit_bias": {str(EOS_TOKEN_ID): 100},
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _stream(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int | None:
    """Relay one stream to its end; the prompt's tokens by vLLM's usage event, or None for the
    sidecar's busy answer (an SSE ``fallback`` event, or a 429/503)."""
    prompt_tokens = None
    async with http.post(f"{url}/v1/completions", json=body) as response:
        async for line in response.content:
            data = line.removeprefix(b"data: ").strip()
            if line.startswith(b"data: ") and data != b"[DONE]":
                usage = json.loads(data).get("usage") or {}
                prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
    return prompt_tokens


async def _engine_idle(http: aiohttp.ClientSession, stack: Stack) -> None:
    """Wait until vLLM runs and queues nothing, so that the steps counted are the burst's."""
    deadline = asyncio.get_running_loop().time() + 10.0
    while True:
        text = await scrape.fetch_text(http, f"{stack.vllm_url}/metrics")
        busy = scrape.total(text, "vllm:num_requests_running")
        busy += scrape.total(text, "vllm:num_requests_waiting")
        if busy == 0:
            return
        assert asyncio.get_running_loop().time() < deadline, "vLLM still busy before the burst"
        await asyncio.sleep(POLL_S)


@dataclass(frozen=True)
class Burst:
    """What a burst did: the most sequences vLLM decoded in one step, and each client's stream."""

    ran_at_once: int
    prompt_tokens: list[int | None]  # None: a busy answer, not a completion


async def _burst(http: aiohttp.ClientSession, stack: Stack, url: str) -> Burst:
    """BURST streams at once through ``url``, read from vLLM's own histogram afterwards: on two
    shared cores a sampler of /capacity can sleep through a whole burst (seen in CI)."""
    await _engine_idle(http, stack)
    before = scrape.decode_steps(await scrape.fetch_text(http, f"{stack.vllm_url}/metrics"))
    prompts = await asyncio.gather(*(_stream(http, url, _body(stack, i)) for i in range(BURST)))
    after = scrape.decode_steps(await scrape.fetch_text(http, f"{stack.vllm_url}/metrics"))
    ran = [k for k in after if after[k] > before[k]]
    return Burst(ran_at_once=max(ran, default=1), prompt_tokens=list(prompts))


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
    """Same budget and alpha: worst-case pricing runs 2 streams at once, adaptive more, and all
    of its burst completes; vLLM preempts nothing."""
    permits = (await scrape.capacity(http, stack.admin_url))["permits"]
    with adaptive_sidecar(stack) as (url, admin):
        await _until_ready(http, admin)
        for index in range(5):  # learn: every completion stops at LENGTH tokens
            assert await _stream(http, url, _body(stack, index)) is not None
        doc = await scrape.capacity(http, admin)
        (learned,) = doc["adaptive"]["expected_completion_tokens"]
        assert learned["tokens"] <= LENGTH + 2, learned  # role/usage events aside
        assert doc["served_model"] == stack.served_model
        assert doc["warnings"] == []
        before = await _preemptions(http, stack)
        adaptive = await _burst(http, stack, url)
        worst_case = await _burst(http, stack, stack.sidecar_url)
        after = await _preemptions(http, stack)
        # What the adaptive sidecar priced by, said beside a failure (a fallback to the worst
        # case, a cut overcommit ratio).
        terms = (await scrape.capacity(http, admin))["adaptive"]
    state = {key: terms[key] for key in ("pricing", "pricing_reason", "overcommit_ratio")}
    report = f"adaptive {adaptive} ({state}), worst case {worst_case}"
    print(f"most streams vLLM decoded at once: {report}")
    served = [n for n in adaptive.prompt_tokens + worst_case.prompt_tokens if n is not None]
    assert all(n > max(scrape.DECODE_BUCKETS) for n in served), report
    assert None not in adaptive.prompt_tokens, report  # adaptive admitted the whole burst
    assert worst_case.ran_at_once <= permits < adaptive.ran_at_once, report
    assert after == before
