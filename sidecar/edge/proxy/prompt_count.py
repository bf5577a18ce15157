"""Asks the engine how long a prompt really is (vLLM's ``POST /tokenize``), for exact pricing.

Opt-in (``SIDECAR_PROMPT_TOKENS=engine``): one extra local round trip per request buys an exact
prompt count for the prompt budget and for token-weighted admission. When the engine cannot
answer, the request keeps its estimate; that is said once in the log, not on every request.

The engine's tokenizer is never a gate: a count has its own deadline (``timeout_s``), and at most
``per_client`` counts of one client address, and ``limit`` in all, are in flight at once; a
request past either, or whose count is late, is priced by its estimate at once.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

import structlog

from sidecar.core.errors import UpstreamError
from sidecar.edge.engine.client import read_all, release, send
from sidecar.edge.engine.pool import EnginePool

log = structlog.get_logger(__name__)


# Why a request was priced by its estimate instead (the log's ``reason``).
Fallback = Literal["unavailable", "timeout", "client_share", "busy"]


class EnginePromptCounter:
    """Counts prompt tokens with the engine's own tokenizer and chat template, within a deadline
    and a share per client address."""

    def __init__(
        self,
        upstream: EnginePool,
        *,
        timeout_s: float = 1.0,
        per_client: int = 4,
        limit: int = 16,
    ) -> None:
        self._upstream = upstream
        self._timeout_s, self._per_client, self._limit = timeout_s, per_client, limit
        self._in_flight: Counter[str] = Counter()  # per client address
        self.fallbacks: Counter[Fallback] = Counter()
        self._warned: set[Fallback] = set()

    @property
    def in_flight(self) -> int:
        return self._in_flight.total()

    async def count(
        self, payload: dict[str, Any], headers: Mapping[str, str], client: str = ""
    ) -> int | None:
        """The engine's token count for ``payload``, or None when it cannot say in time, or
        ``client`` (or everyone) already has its share of counts in flight."""
        if self._in_flight[client] >= self._per_client:
            self._fell_back("client_share")
            return None
        if self.in_flight >= self._limit:
            self._fell_back("busy")
            return None
        self._in_flight[client] += 1
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._ask(payload, headers)
        except TimeoutError:
            self._fell_back("timeout", timeout_s=self._timeout_s)
            return None
        finally:
            self._in_flight[client] -= 1
            if not self._in_flight[client]:
                del self._in_flight[client]

    async def _ask(self, payload: dict[str, Any], headers: Mapping[str, str]) -> int | None:
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
            self._fell_back("unavailable", error=str(exc))
            return None
        count = _count_of(body) if response.status == 200 else None
        if count is None:
            self._fell_back("unavailable", status=response.status)
            return None
        return count

    def _fell_back(self, reason: Fallback, **details: object) -> None:
        """Counted, and said once per reason at warning level (then at debug)."""
        self.fallbacks[reason] += 1
        level = log.debug if reason in self._warned else log.warning
        level("prompt_count_unavailable", fallback="estimate", reason=reason, **details)
        self._warned.add(reason)


def _count_of(body: bytes) -> int | None:
    try:
        count = json.loads(body).get("count")
    except (ValueError, AttributeError):
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) else None
