"""Structured JSON logs: one event per line, request ids from contextvars, secrets never written."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

SECRET_KEYS = frozenset({"authorization", "api_key", "api-key", "x-api-key", "cookie", "password"})
SECRET_PREFIXES = ("Bearer ", "bearer ", "sk-")


def redact_secrets(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A processor: secrets under a known key or with a known prefix are replaced, never logged."""
    for key, value in event.items():
        if key.lower() in SECRET_KEYS or (
            isinstance(value, str) and value.startswith(SECRET_PREFIXES)
        ):
            event[key] = "[redacted]"
    return event


def configure_logging(level: str, stream: TextIO = sys.stdout) -> None:
    """Configure structlog once, at the entry point, to write JSON lines at ``level`` and above."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
