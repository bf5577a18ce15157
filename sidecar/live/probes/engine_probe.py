"""The engine probe: scrape the engine's ``/metrics``, tell which engine serves it, and read it in
that engine's dialect (vLLM, SGLang, llama.cpp); HTTP failures are translated in one place.

The engine is told by the prefix of its metric names (``vllm:``, ``sglang:``, ``llamacpp:``); a
llama-server started without ``--metrics`` answers ``/metrics`` with 501 and is known by its
``/props``. ``engine`` pins a dialect instead (SIDECAR_CAPACITY_SOURCE=vllm|sglang|llamacpp).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from sidecar.core.errors import ProbeTemporaryError
from sidecar.core.redaction import redact_url
from sidecar.live.probes import EngineReading
from sidecar.live.probes.engine import parse_metrics
from sidecar.live.probes.llamacpp import is_llamacpp_props, parse_llamacpp
from sidecar.live.probes.sglang import parse_sglang

ENGINES = ("vllm", "sglang", "llamacpp")
_PREFIX = re.compile(r"^(?:# (?:HELP|TYPE) )?(vllm|sglang|llamacpp):", re.MULTILINE)
_PARSERS: dict[str, Callable[[str, float], EngineReading]] = {
    "vllm": parse_metrics,
    "sglang": parse_sglang,
}


def engine_of(text: str) -> str | None:
    """The engine whose metric names the exposition text carries (the first one named)."""
    match = _PREFIX.search(text)
    return None if match is None else match.group(1)


def model_card_of(body: Any) -> tuple[str | None, int | None]:
    """The first model's id and ``max_model_len`` in an OpenAI ``/v1/models`` answer (vLLM and
    SGLang state the length there; llama.cpp's comes from its /props)."""
    data = body.get("data") if isinstance(body, dict) else None
    if not (isinstance(data, list) and data and isinstance(data[0], dict)):
        return None, None
    name, length = data[0].get("id"), data[0].get("max_model_len")
    return (
        name if isinstance(name, str) else None,
        length if isinstance(length, int) and not isinstance(length, bool) else None,
    )


class EngineMetricsProbe:
    """Fetches ``url`` (the engine's /metrics), and ``base_url``'s /v1/models, /props and /slots,
    over one kept-alive session: ``session``, or one of its own opened on the first read and
    closed by ``close()``."""

    def __init__(
        self,
        url: str,
        *,
        engine: str = "auto",
        base_url: str | None = None,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 2.0,
        llamacpp_kv_unified: bool = True,
    ) -> None:
        if engine not in ("auto", *ENGINES):
            raise ValueError(f"unknown engine {engine!r}: auto, {', '.join(ENGINES)}")
        self._url, self._engine, self._base = url, engine, base_url
        self._card: tuple[str | None, int | None] | None = None
        self._session = session
        self._owned: aiohttp.ClientSession | None = None
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._kv_unified = llamacpp_kv_unified

    async def read(self) -> EngineReading:
        """Scrape and parse; an unreachable or failing engine raises ProbeTemporaryError."""
        status, text = await self._get(self._url)
        if status != 200:
            reading = await self._without_metrics(status)
        else:
            engine = engine_of(text) if self._engine == "auto" else self._engine
            reading = await self._parse(engine or "vllm", text)
        return await self._with_model_card(reading)

    async def close(self) -> None:
        """Close the session this probe opened (a session it was given is its owner's)."""
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.close()

    async def _parse(self, engine: str, text: str) -> EngineReading:
        try:
            if engine == "llamacpp":
                return await self._llamacpp(text)
            return _PARSERS[engine](text, self._clock())
        except ValueError as exc:
            msg = f"{engine} metrics at {redact_url(self._url)} cannot be read: {exc}"
            raise ProbeTemporaryError(msg) from exc

    async def _without_metrics(self, status: int) -> EngineReading:
        """No /metrics: a llama-server without ``--metrics`` still says its slots in /props."""
        failed = ProbeTemporaryError(f"engine at {redact_url(self._url)} answered HTTP {status}")
        if self._engine not in ("auto", "llamacpp") or self._base is None:
            raise failed
        props = await self._json(self._base + "/props")
        if not is_llamacpp_props(props):
            raise failed
        slots = await self._json(self._base + "/slots")
        return parse_llamacpp(props, self._clock(), slots=slots, kv_unified=self._kv_unified)

    async def _llamacpp(self, text: str) -> EngineReading:
        if self._base is None:
            raise ValueError("llama.cpp's slots are read from its /props: no engine URL given")
        props = await self._json(self._base + "/props")
        return parse_llamacpp(props, self._clock(), metrics=text, kv_unified=self._kv_unified)

    async def _with_model_card(self, reading: EngineReading) -> EngineReading:
        """The served model (and its length where the engine states it), asked once until an
        answer; a failure is not an error."""
        if self._card is None and self._base is not None:
            card = model_card_of(await self._json(self._base + "/v1/models"))
            self._card = card if card[0] is not None else None
        served, length = self._card or (None, None)
        return dataclasses.replace(
            reading, served_model=served, max_model_len=reading.max_model_len or length
        )

    async def _json(self, url: str) -> Any:
        """A JSON answer, or None (an error, a non-200, or not JSON): each caller says why it
        can do without."""
        try:
            status, text = await self._get(url)
            return json.loads(text) if status == 200 else None
        except (ProbeTemporaryError, ValueError):
            return None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is not None:
            return self._session
        if self._owned is None or self._owned.closed:
            self._owned = aiohttp.ClientSession()
        return self._owned

    async def _get(self, url: str) -> tuple[int, str]:
        try:
            async with self._client().get(url, timeout=self._timeout) as response:
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            msg = f"engine at {redact_url(url)} unreachable: {exc or type(exc).__name__}"
            raise ProbeTemporaryError(msg) from exc
