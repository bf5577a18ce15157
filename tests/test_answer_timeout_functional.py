"""A non-streaming answer that takes longer than the read timeout: cut only when the engine is
silent, not for its length; a timeout says which phase it struck."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from structlog.testing import capture_logs

from emulator.app import build_app
from emulator.config import EmulatorConfig
from tests.servers import proxy_url, serve_app, sidecars

# 12 tokens at 4 a second: the whole answer comes after about 3 s, past a 2 s read timeout. The
# probe answers every 0.1 s, so the engine is heard within the timeout even on a loaded machine
# (at 1 s, a CI runner with four test workers stalled the probe past it now and then: a 504).
BODY = {"model": "tiny-llama", "prompt": "a long answer", "max_tokens": 12, "stream": False}
TIMEOUTS = {"SIDECAR_UPSTREAM_READ_TIMEOUT_MS": "2000", "SIDECAR_REFRESH_MS": "100"}


@pytest.fixture
async def slow_engine() -> AsyncIterator[str]:
    config = EmulatorConfig(model_name="tiny-llama", tokens_per_s=4)
    runner, url = await serve_app(build_app(config))
    yield url
    await runner.cleanup()


async def test_a_long_answer_from_a_live_engine_completes(slow_engine: str) -> None:
    """The engine answers its probe while it works: the answer arrives whole, 200."""
    async with sidecars(slow_engine) as start:
        server = await start(SIDECAR_CAPACITY_SOURCE="auto", **TIMEOUTS)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{proxy_url(server)}/v1/completions", json=BODY) as response,
        ):
            assert response.status == 200
            assert (await response.json())["usage"]["completion_tokens"] == 12


async def test_without_a_probe_the_silence_is_a_timeout_of_the_answer(slow_engine: str) -> None:
    """Where nothing probes the engine (static source), 2 s of silence is a 504, logged as the
    answer's phase: the request had reached the engine."""
    async with sidecars(slow_engine) as start:
        server = await start(**TIMEOUTS)
        with capture_logs() as logs:
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{proxy_url(server)}/v1/completions", json=BODY) as response,
            ):
                assert response.status == 504
    (failed,) = [line for line in logs if line["event"] == "upstream_failed"]
    assert failed["phase"] == "answer"
