"""A module's logger: structlog's, minus the lazy proxy's cost on every call where structlog is
told to cache loggers on first use (``serve``: ``configure_logging(cache=True)``).

``structlog.get_logger`` gives a lazy proxy, and every ``log.info`` on it goes through the proxy's
``__getattr__``, which hands out its bound logger's method anew, even where the level then drops
the line: ~1 µs, ~8.6k instructions under callgrind, twice a request (~2% of one). Where the
configuration says loggers may be cached, a ModuleLogger keeps each method the first time it is
asked for, so that a call the level filters out is a slot read and an empty call. Where it does
not (the tests, which reconfigure through ``structlog.testing.capture_logs``), every call goes
through the proxy, as with structlog's own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

_METHODS = frozenset({"debug", "info", "warning", "error", "critical", "exception"})


class ModuleLogger:
    """``structlog.get_logger(name)``, its level methods kept once caching is allowed."""

    __slots__ = ("_proxy", *sorted(_METHODS))

    debug: Callable[..., Any]
    info: Callable[..., Any]
    warning: Callable[..., Any]
    error: Callable[..., Any]
    critical: Callable[..., Any]
    exception: Callable[..., Any]

    def __init__(self, name: str) -> None:
        self._proxy = structlog.get_logger(name)

    def __getattr__(self, name: str) -> Any:
        """Reached only while ``name`` is not kept: the proxy's, kept where structlog caches."""
        found = getattr(self._proxy, name)
        if name in _METHODS and structlog.get_config()["cache_logger_on_first_use"]:
            setattr(self, name, found)
        return found
