"""Asks the engine how long a prompt really is (vLLM's ``POST /tokenize``), for exact pricing.

Opt-in (``SIDECAR_PROMPT_TOKENS=engine``): one extra local round trip per request buys an exact
prompt count for the prompt budget and for token-weighted admission. When the engine cannot
answer, the request keeps its estimate; that is said once in the log, not on every request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import structlog

from sidecar.core.errors import UpstreamError
from sidecar.edge.engine.client import read_all, release, send
from sidecar.edge.engine.pool import EnginePool

log = structlog.get_logger(__name__)


class EnginePromptCounter:
    """Counts prompt tokens with the engine's own tokenizer and chat template."""

    def __init__(self, upstream: EnginePool) -> None:
        self._upstream = upstream
        self._warned = False

    async def count(self, payload: dict[str, Any], headers: Mapping[str, str]) -> int | None:
        """The engine's token count for ``payload``, or None when it cannot say."""
        sent = {**headers, "Content-Type": "application/json"}
        try:
            response = await send(
                self._upstream, "POST", "/tokenize", sent, json.dumps(payload).encode()
            )
            try:
                body = await read_all(response)
            finally:
                release(response)
        except UpstreamError as exc:
            self._failed(error=str(exc))
            return None
        count = _count_of(body) if response.status == 200 else None
        if count is None:
            self._failed(status=response.status)
        return count

    def _failed(self, **details: object) -> None:
        level = log.debug if self._warned else log.warning
        level("prompt_count_unavailable", fallback="estimate", **details)
        self._warned = True


def _count_of(body: bytes) -> int | None:
    try:
        count = json.loads(body).get("count")
    except (ValueError, AttributeError):
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) else None
