"""SIDECAR_EVENT_LOOP: which loop `sidecar serve` runs on, and a clear error where it cannot."""

from __future__ import annotations

import asyncio
import importlib
from types import ModuleType

import pytest
import uvloop

from sidecar.core.errors import ConfigError
from sidecar.entry.event_loop import loop_factory, running_loop_name


def _without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def import_module(name: str, package: str | None = None) -> ModuleType:
        if name == "uvloop":
            raise ModuleNotFoundError("No module named 'uvloop'", name="uvloop")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)


def test_auto_takes_uvloop_where_it_is_installed() -> None:
    factory = loop_factory("auto")
    assert factory is uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(_name()) == "uvloop"


def test_asyncio_is_asyncios_own_loop() -> None:
    assert loop_factory("asyncio") is None
    with asyncio.Runner(loop_factory=loop_factory("asyncio")) as runner:
        assert runner.run(_name()) == "asyncio"


def test_auto_without_uvloop_falls_back_to_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_uvloop(monkeypatch)
    assert loop_factory("auto") is None


def test_uvloop_asked_for_and_missing_is_an_error_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without_uvloop(monkeypatch)
    with pytest.raises(ConfigError, match=r"SIDECAR_EVENT_LOOP=uvloop.*not installed"):
        loop_factory("uvloop")


async def _name() -> str:
    return running_loop_name()
