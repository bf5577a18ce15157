"""The proxy port over real sockets forwards the engine's API and nothing else unless told to."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.engine_double import EngineDouble, double
from tests.servers import StartSidecar, error_of, proxy_url, sidecars

__all__ = ["double"]


@pytest.fixture
async def start(double: EngineDouble) -> AsyncIterator[StartSidecar]:
    """Start sidecars in front of the recording double; stopped at teardown."""
    async with sidecars(double.url) as start:
        yield start


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("GET", "/metrics", id="engine-metrics"),
        pytest.param("GET", "/v1/../metrics", id="metrics-dot-dot"),
        pytest.param("POST", "/sleep", id="engine-admin"),
        pytest.param("GET", "/v1", id="v1-without-slash"),
    ],
)
async def test_a_path_outside_the_api_is_404_and_never_reaches_the_engine(
    start: StartSidecar, double: EngineDouble, method: str, path: str
) -> None:
    """By default the engine's /metrics (and any other non-API path) is a 404 from the sidecar."""
    server = await start()
    async with aiohttp.ClientSession() as s, s.request(method, proxy_url(server) + path) as r:
        assert r.status == 404
        assert error_of(await r.read())["code"] == "not_found"
    assert double.seen == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("GET", "/v1/models", id="models"),
        pytest.param("GET", "/health", id="health"),
        pytest.param("POST", "/tokenize", id="free-path"),
    ],
)
async def test_the_api_and_the_free_paths_are_forwarded(
    start: StartSidecar, double: EngineDouble, method: str, path: str
) -> None:
    """The OpenAI API, the engine's health and the free paths pass as before."""
    server = await start()
    async with aiohttp.ClientSession() as s, s.request(method, proxy_url(server) + path) as r:
        assert r.status == 200
    assert double.seen == [(method, path)]


async def test_metrics_is_forwarded_once_configured(
    start: StartSidecar, double: EngineDouble
) -> None:
    """SIDECAR_FORWARD_PATHS opens more paths: here the engine's /metrics, through the proxy."""
    server = await start(SIDECAR_FORWARD_PATHS="/v1/,/health,/metrics")
    async with aiohttp.ClientSession() as s, s.get(proxy_url(server) + "/metrics") as r:
        assert r.status == 200
    assert double.seen == [("GET", "/metrics")]
