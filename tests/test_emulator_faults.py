"""Fault injection through the x-emulator-fault header: parsing, and each fault over a socket."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from emulator import EmulatorConfig, build_app
from emulator.faults import Fault, parse_fault

MODEL = "emulated-llama"
BODY = {"model": MODEL, "prompt": "one two three", "max_tokens": 8, "stream": True}


@pytest.mark.parametrize(
    ("header", "fault"),
    [
        pytest.param(None, Fault(), id="none"),
        pytest.param("reset-after=3", Fault(reset_after=3), id="reset"),
        pytest.param("stall-after=0", Fault(stall_after=0), id="stall-at-once"),
        pytest.param("status=503", Fault(status=503), id="status"),
        pytest.param("slow-first-token=1.5", Fault(slow_first_token_s=1.5), id="slow-first"),
        pytest.param(
            "status=429; slow-first-token=2", Fault(status=429, slow_first_token_s=2.0), id="two"
        ),
    ],
)
def test_parse_fault(header: str | None, fault: Fault) -> None:
    """Each directive lands in its field; several can be combined with ';'."""
    assert parse_fault(header) == fault


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("explode=1", id="unknown"),
        pytest.param("reset-after=soon", id="not-a-number"),
        pytest.param("stall-after=-1", id="negative"),
    ],
)
def test_parse_fault_rejects_nonsense(header: str) -> None:
    """A malformed header is an error, not silently no fault."""
    with pytest.raises(ValueError, match="x-emulator-fault"):
        parse_fault(header)


class RecordingSleep:
    """Records pacing delays without letting real time pass."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


@pytest.fixture
def sleep() -> RecordingSleep:
    return RecordingSleep()


@pytest.fixture
async def base_url(
    aiohttp_server: Callable[..., Awaitable[TestServer]], sleep: RecordingSleep
) -> str:
    config = EmulatorConfig(max_model_len=256, kv_tokens=1024, max_num_seqs=1, ttft_s=0.25)
    server = await aiohttp_server(build_app(config, sleep=sleep, poll_s=0.01))
    return f"http://{server.host}:{server.port}"


async def gauges(base_url: str) -> tuple[float, float, float]:
    """(running, waiting, kv usage) from the emulator's /metrics."""
    async with aiohttp.ClientSession() as session, session.get(f"{base_url}/metrics") as resp:
        text = await resp.text()
    values = {
        family.name: family.samples[0].value
        for family in text_string_to_metric_families(text)
        if family.samples  # a labelled counter shows no sample before its first request
    }
    return (
        values["vllm:num_requests_running"],
        values["vllm:num_requests_waiting"],
        values["vllm:kv_cache_usage_perc"],
    )


async def settles(base_url: str, expected: tuple[float, float, float]) -> None:
    """Poll /metrics for up to 2 s: a disconnect is noticed asynchronously."""
    for _ in range(200):
        if await gauges(base_url) == expected:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gauges stuck at {await gauges(base_url)}, expected {expected}")


async def data_lines(response: aiohttp.ClientResponse, count: int) -> list[bytes]:
    """Read ``count`` SSE data lines."""
    lines: list[bytes] = []
    while len(lines) < count:
        line = await response.content.readline()
        if line.startswith(b"data:"):
            lines.append(line)
    return lines


async def collect_data(response: aiohttp.ClientResponse, into: list[bytes]) -> None:
    """Append every SSE data line until the body ends (or breaks)."""
    async for line in response.content:
        if line.startswith(b"data:"):
            into.append(line)


async def test_reset_after_drops_the_connection_and_frees_the_request(base_url: str) -> None:
    """reset-after=2: two tokens arrive, then the connection breaks; the engine is idle again."""
    received: list[bytes] = []
    async with aiohttp.ClientSession() as session:
        headers = {"x-emulator-fault": "reset-after=2"}
        async with session.post(f"{base_url}/v1/completions", json=BODY, headers=headers) as resp:
            with pytest.raises(aiohttp.ClientPayloadError):
                await collect_data(resp, received)
    assert len(received) == 2
    assert b"[DONE]" not in received[-1]
    await settles(base_url, (0.0, 0.0, 0.0))


async def test_stall_after_keeps_the_request_until_the_client_leaves(base_url: str) -> None:
    """stall-after=1: one token, then silence on an open connection; leaving frees the blocks."""
    async with aiohttp.ClientSession() as session:
        headers = {"x-emulator-fault": "stall-after=1"}
        async with session.post(f"{base_url}/v1/completions", json=BODY, headers=headers) as resp:
            assert len(await data_lines(resp, 1)) == 1
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(data_lines(resp, 1), 0.2)
            running, _, usage = await gauges(base_url)
            assert running == 1
            assert usage > 0
    await settles(base_url, (0.0, 0.0, 0.0))


async def test_disconnect_while_queued_leaves_the_queue(base_url: str) -> None:
    """A client that gives up while queued behind max_num_seqs is dropped from the queue."""
    async with aiohttp.ClientSession() as session:
        stall = {"x-emulator-fault": "stall-after=1"}
        async with session.post(f"{base_url}/v1/completions", json=BODY, headers=stall) as first:
            await data_lines(first, 1)
            queued = asyncio.create_task(session.post(f"{base_url}/v1/completions", json=BODY))
            await settles(base_url, (1.0, 1.0, (await gauges(base_url))[2]))
            queued.cancel()
            await settles(base_url, (1.0, 0.0, (await gauges(base_url))[2]))
    await settles(base_url, (0.0, 0.0, 0.0))


@pytest.mark.parametrize("status", [pytest.param(503, id="503"), pytest.param(429, id="429")])
async def test_status_fault_answers_an_openai_error(base_url: str, status: int) -> None:
    """status=N answers N with an OpenAI-shaped body that the SDK turns into its error."""
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1",
        api_key="none",
        max_retries=0,
        default_headers={"x-emulator-fault": f"status={status}"},
    ) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            await client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert caught.value.status_code == status
    assert "injected fault" in caught.value.message


async def test_slow_first_token_adds_to_ttft(base_url: str, sleep: RecordingSleep) -> None:
    """slow-first-token=1.5 waits the configured TTFT plus 1.5 s before the first token."""
    headers: dict[str, Any] = {"x-emulator-fault": "slow-first-token=1.5"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base_url}/v1/completions", json=BODY, headers=headers) as resp,
    ):
        body = await resp.read()
    assert body.endswith(b"data: [DONE]\n\n")
    assert sleep.delays[0] == pytest.approx(1.75)


async def test_bad_fault_header_is_a_400(base_url: str) -> None:
    """A malformed fault header is refused rather than ignored."""
    headers = {"x-emulator-fault": "explode=1"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base_url}/v1/completions", json=BODY, headers=headers) as resp,
    ):
        payload = await resp.json()
    assert resp.status == 400
    assert payload["error"]["param"] == "x-emulator-fault"
