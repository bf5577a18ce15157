"""The event loop the benchmark's own processes (client, stand-in engine) run on: uvloop if present.

The tools should cost as little CPU as possible, so that what a run measures is the proxy. uvloop
is a project dependency (the sidecar's own loop, where installed: sidecar/entry/event_loop.py);
the load tools use it whatever the sidecar is told to run on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from sidecar.entry import event_loop
from sidecar.entry.settings import load_settings

T = TypeVar("T")
LoopFactory = event_loop.LoopFactory


def loop_factory() -> LoopFactory | None:
    """uvloop's where it is installed (the load tools' loop, whatever the sidecar runs on)."""
    return event_loop.loop_factory("auto")


def run(main: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


def serve_loop() -> LoopFactory | None:
    """The loop ``sidecar serve`` would run on here: SIDECAR_EVENT_LOOP from the environment,
    read as serve reads it (unset or auto: uvloop where installed); for what stands in for it."""
    value = os.environ.get("SIDECAR_EVENT_LOOP", "") or "auto"
    return event_loop.loop_factory(load_settings({"SIDECAR_EVENT_LOOP": value}).event_loop)


def run_as_serve(main: Coroutine[Any, Any, T]) -> T:
    """``main`` on :func:`serve_loop`'s loop."""
    with asyncio.Runner(loop_factory=serve_loop()) as runner:
        return runner.run(main)
