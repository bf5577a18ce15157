"""The request a log line belongs to: one context variable, set once per request by the proxy and
read only when a line is written (``merge_request``, a structlog processor).

One variable holds the pair, set and reset with one token (structlog's ``bind_contextvars``
keeps a variable per key). Each request runs in a task of its own, so what one binds never
reaches another's lines.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from contextvars import ContextVar, Token
from typing import Any

_REQUEST: ContextVar[tuple[str, str | None] | None] = ContextVar("sidecar_request", default=None)

RequestToken = Token[tuple[str, str | None] | None]


def bind_request(request_id: str, tenant: str | None) -> RequestToken:
    """The lines written from here on (in this task) carry ``request_id`` and ``tenant``."""
    return _REQUEST.set((request_id, tenant))


def unbind_request(token: RequestToken) -> None:
    """Back to what was bound before ``bind_request`` gave ``token``."""
    _REQUEST.reset(token)


def merge_request(
    logger: object, method_name: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: the bound request's ``tenant`` and ``request_id``, unless the line
    names its own."""
    bound = _REQUEST.get()
    if bound is not None:
        event_dict.setdefault("tenant", bound[1])
        event_dict.setdefault("request_id", bound[0])
    return event_dict
