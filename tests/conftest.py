"""Shared fixtures: real servers on loopback sockets live in tests/servers.py.

Tests marked ``gpu`` run only where a real NVIDIA driver is present, and then for real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.servers"]

NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests without a driver; with one, they run for real."""
    if NVIDIA_DRIVER.exists():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU and driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
