"""The event loop ``sidecar serve`` runs on (``SIDECAR_EVENT_LOOP``): uvloop where it is installed,
else asyncio's own.

uvloop runs the loop, its timers and the socket transports in C (libuv), so the relay's own
work is most of what a relayed event costs (docs/lab/performance.md). Nothing else depends on the
choice: the protocols take any transport, and the edge's server, relay and
engine-client tests run on both loops (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from typing import Literal, cast

from sidecar.core.errors import ConfigError

EventLoop = Literal["auto", "uvloop", "asyncio"]
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def loop_factory(choice: EventLoop) -> LoopFactory | None:
    """What ``asyncio.Runner`` makes its loop with for ``choice`` (None: asyncio's default).

    ``auto`` takes uvloop when it can be imported; ``uvloop`` without it is a ConfigError.
    """
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError as exc:
        if choice == "uvloop":
            raise ConfigError(
                "SIDECAR_EVENT_LOOP=uvloop, but uvloop is not installed "
                "(pip install uvloop, or set auto or asyncio)"
            ) from exc
        return None
    return cast(LoopFactory, uvloop.new_event_loop)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: which loop runs the caller (for the start-up log line)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
