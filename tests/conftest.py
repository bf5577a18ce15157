"""Shared fixtures: real servers on loopback sockets live in tests/servers.py.

Tests marked ``gpu`` run only where a real NVIDIA driver is present, and then for real
(``make test-gpu`` sets SIDECAR_TEST_GPU=1 once NVML has listed a GPU, for sandboxes that hide
/proc/driver/nvidia).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import uvloop
from hypothesis import settings

# Hypothesis' per-example deadline is a timed assertion: on 2 cores shared by four test workers
# (CI) an example can take 200 ms for no fault of the code. Properties are checked, not timed.
settings.register_profile("sidecar", deadline=None)
settings.load_profile("sidecar")

pytest_plugins = ["tests.servers"]

NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")

# `sidecar serve` runs on uvloop where it is installed (SIDECAR_EVENT_LOOP=auto): the edge's own
# server, relay and engine client are tested on both loops; everything else on asyncio's.
BOTH_LOOPS = frozenset(
    {
        "tests.test_edge_door_functional",
        "tests.test_edge_functional",
        "tests.test_engine_client",
        "tests.test_engine_http",
        "tests.test_proxy_functional",
        "tests.test_proxy_http1",
        "tests.test_proxy_server",
        "tests.test_flow",
        "tests.test_pipelining_functional",
        "tests.test_slow_reader_functional",
    }
)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if getattr(item, "module", None) is not None and item.module.__name__ in BOTH_LOOPS:  # type: ignore[attr-defined]
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests without a driver; with one, they run for real."""
    if NVIDIA_DRIVER.exists() or os.environ.get("SIDECAR_TEST_GPU") == "1":
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU and driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
