"""The event loop the benchmark's own processes (client, stand-in engine) run on: uvloop if present.

The tools should cost as little CPU as possible, so that what a run measures is the proxy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
