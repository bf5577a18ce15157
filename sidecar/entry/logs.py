"""Structured JSON logs: one event per line, request ids from contextvars, secrets never written.

Everything ends up as JSON, also what aiohttp and asyncio log through the standard library (a
parser error, a failed ``accept()`` at the descriptor limit): :class:`StdlibBridge` and
:func:`loop_exception_handler` turn those into events, without tracebacks, at most once per
interval per kind, so a flood of identical errors is one line and a count.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import structlog

from sidecar.core.redaction import redact_url
from sidecar.telemetry.log_context import merge_request

SECRET_KEYS = ("authorization", "api_key", "api-key", "apikey", "cookie", "password", "secret")
SECRET_PREFIXES = ("Bearer ", "bearer ", "sk-")
# Secrets inside free text (an error message quoting a header line, say).
SECRET_TEXT = re.compile(
    r"(?i)(authorization|api[-_]?key|cookie)(\s*[:=]\s*)[^\r\n]*|bearer\s+\S+|sk-[\w-]{6,}"
)
REPEAT_INTERVAL_S = 10.0
MAX_TEXT = 300


# Every match of SECRET_TEXT, and of redact_url's patterns (a URL's userinfo, a key-like query
# value), contains one of these, in any case: in ASCII text (where the patterns' case-blindness
# is ASCII's) their absence means there is nothing to scrub.
SECRET_WORDS = ("auth", "api", "cookie", "bearer", "sk-", "://", "key", "token", "secret", "pass")
_ANY_SECRET_WORD = re.compile("|".join(map(re.escape, SECRET_WORDS)))


def _scrub(text: str) -> str:
    return SECRET_TEXT.sub(
        lambda m: f"{m.group(1)}{m.group(2)}[redacted]" if m.group(1) else "[redacted]",
        redact_url(text),
    )


def may_hold_secret(text: str) -> bool:
    """False only for text SECRET_TEXT cannot match: ASCII without any of SECRET_WORDS, so that
    most strings skip the full regex."""
    if not text.isascii():
        return True  # Unicode case-blindness (a long s, a dotless i): the regex decides
    return _ANY_SECRET_WORD.search(text.lower()) is not None


@functools.lru_cache(maxsize=1024)
def _secret_key(key: str) -> bool:
    """Field names come from the code (and a few libraries): each is checked once."""
    lowered = key.lower()
    return any(part in lowered for part in SECRET_KEYS)


def redact_secrets(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A processor: secrets under a known key, with a known prefix, or inside text are removed."""
    for key, value in event.items():
        if _secret_key(key):
            event[key] = "[redacted]"
        elif isinstance(value, str):
            if value.startswith(SECRET_PREFIXES):
                event[key] = "[redacted]"
            elif may_hold_secret(value):
                event[key] = _scrub(value)
    return event


class OncePer:
    """Lets one event per key through per interval, counting the ones it held back."""

    def __init__(
        self, interval_s: float = REPEAT_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval, self._clock = interval_s, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str) -> int | None:
        """None to hold this one back; else how many were held back since the last one."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


class StdlibBridge(logging.Handler):
    """Standard-library records (aiohttp, asyncio) as structlog events, rate-limited, no trace."""

    def __init__(self, limiter: OncePer | None = None) -> None:
        super().__init__()
        self._limiter = limiter or OncePer()

    def emit(self, record: logging.LogRecord) -> None:
        key = f"{record.name}:{record.msg}"
        held = self._limiter.allow(key)
        if held is None:
            return
        error = record.exc_info[1] if record.exc_info else None
        structlog.get_logger(record.name).log(
            record.levelno,
            "library_log",
            logger=record.name,
            message=_scrub(_text_of(record))[:MAX_TEXT],
            error=type(error).__name__ if error is not None else None,
            repeated=held,
        )


def _text_of(record: logging.LogRecord) -> str:
    """The record's message with its arguments filled in; the bare template if they do not fit."""
    try:
        return record.getMessage()
    except (TypeError, ValueError):
        return str(record.msg)


LoopHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]


def loop_exception_handler(limiter: OncePer | None = None) -> LoopHandler:
    """An asyncio exception handler that logs one JSON event per kind and interval."""
    once = limiter or OncePer()

    def handle(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        message = str(context.get("message", ""))
        held = once.allow(f"loop:{message}:{type(error).__name__}")
        if held is None:
            return
        structlog.get_logger("asyncio").error(
            "loop_error",
            message=_scrub(message)[:MAX_TEXT],
            error=type(error).__name__ if error is not None else None,
            detail=_scrub(str(error))[:MAX_TEXT] if error is not None else None,
            repeated=held,
        )

    return handle


def configure_logging(level: str, stream: TextIO = sys.stdout, *, cache: bool = False) -> None:
    """Configure structlog once, at the entry point, to write JSON lines at ``level`` and above;
    route the standard library's records (aiohttp, asyncio) through it.

    ``cache``: each module's logger is built once, on first use. Only for a process that never
    reconfigures structlog (``serve``): a cached logger ignores ``structlog.testing.capture_logs``,
    so tests leave it off.
    """
    structlog.configure(
        processors=[
            merge_request,  # the request's id and tenant
            structlog.processors.format_exc_info,  # a traceback is text to redact too
            redact_secrets,  # before the level and the time, which are ours
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=cache,
    )
    root = logging.getLogger()
    root.handlers[:] = [StdlibBridge()]
    root.setLevel(logging.WARNING)
