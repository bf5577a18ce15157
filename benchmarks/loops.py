"""The event loop the benchmark's own processes (client, stand-in engine) run on: uvloop if present.

The tools should cost as little CPU as possible, so that what a run measures is the proxy. uvloop
is a project dependency since issue 14's seventh pass (the sidecar's own loop, where installed:
sidecar/entry/event_loop.py); the load tools use it whatever the sidecar is told to run on.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, cast

T = TypeVar("T")
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory() -> LoopFactory | None:
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return None
    return cast(LoopFactory, uvloop.new_event_loop)


def run(main: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
