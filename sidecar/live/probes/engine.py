"""The engine's own view: scrape vLLM's ``/metrics`` and read its KV cache configuration and load.

:func:`parse_metrics` is pure (text in, reading out, parsed by ``prometheus_client.parser``);
:class:`VllmMetricsProbe` only fetches the text and translates HTTP failures in one place.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sidecar.core.errors import ProbeTemporaryError
from sidecar.live.probes import EngineCacheConfig, EngineReading

_SUMMED = {
    "vllm:kv_cache_usage_perc": "kv_usage_ratio",
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:num_preemptions_total": "preemptions_total",
}


_CACHE_INFO = "vllm:cache_config_info"
# Family and sample names the probe reads; a counter's family may be named without its _total.
_WANTED = frozenset({*_SUMMED, _CACHE_INFO, "vllm:num_preemptions"})
_NAME_CHARS = "a-zA-Z0-9_:"
# A sample, HELP or TYPE line of a family the probe never reads, with its newline. A line is kept
# when its name (the longest run of name characters) is one of _WANTED, or when it does not start
# with a name: a comment, a blank line, or text that is not Prometheus at all.
_UNREAD_LINE = re.compile(
    rf"^(?:# (?:HELP|TYPE) )?"
    rf"(?!(?:{'|'.join(map(re.escape, sorted(_WANTED)))})(?![{_NAME_CHARS}]))"
    rf"[a-zA-Z_:][{_NAME_CHARS}]*.*\n?",
    re.MULTILINE,
)
# A sample line of the cache configuration, with its newline.
_CACHE_INFO_SAMPLE = re.compile(rf"^{re.escape(_CACHE_INFO)}(?![{_NAME_CHARS}]).*\n?", re.MULTILINE)


def relevant_lines(text: str) -> str:
    """The exposition text without the samples, HELP and TYPE lines of families we never read.

    vLLM's /metrics is mostly histograms the probe ignores; parsing only what it reads takes the
    scrape from ~8 ms to well under 1 ms of event-loop time per tick (benchmarks/probe_bench.py).
    One substitution in C drops them (a loop over the lines in Python cost as much again as the
    parse). Lines that do not start with a metric name are kept, so text that is not Prometheus
    still fails to parse; lines end at ``\n`` alone, as the parser reads them.
    """
    return _UNREAD_LINE.sub("", text)


def parse_metrics(text: str, observed_at: float) -> EngineReading:
    """Read vLLM's exposition text; every series is summed over the ``engine`` label.

    The usage ratio is the mean over engines, since each engine's is a fraction of its own pool.
    The cache configuration's samples are parsed apart and remembered by their text: each carries
    ~40 labels, two thirds of the parse, and they change only when the engine restarts.
    """
    kept = relevant_lines(text)
    info = tuple(_CACHE_INFO_SAMPLE.findall(kept))
    samples = _samples(_CACHE_INFO_SAMPLE.sub("", kept))
    return _reading(samples, _cache_config_of(info), observed_at)


def parse_families(text: str, observed_at: float) -> EngineReading:
    """:func:`parse_metrics` without dropping the families it never reads first."""
    samples = _samples(text)
    return _reading(
        samples, _cache_config(s for s in samples if s.name == _CACHE_INFO), observed_at
    )


def _samples(text: str) -> list[Sample]:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


@functools.lru_cache(maxsize=8)
def _cache_config_of(lines: tuple[str, ...]) -> EngineCacheConfig | None:
    """The cache configuration in these sample lines; the parser's ValueError is never kept."""
    return _cache_config(s for s in _samples("".join(lines)) if s.name == _CACHE_INFO)


def _reading(
    samples: list[Sample], cache: EngineCacheConfig | None, observed_at: float
) -> EngineReading:
    values: dict[str, list[float]] = {field: [] for field in _SUMMED.values()}
    for sample in samples:
        if sample.name in _SUMMED:
            values[_SUMMED[sample.name]].append(sample.value)
    usage = values.pop("kv_usage_ratio")
    summed = {field: (sum(v) if v else None) for field, v in values.items()}
    return EngineReading(
        cache=cache,
        kv_usage_ratio=sum(usage) / len(usage) if usage else None,
        requests_running=summed["requests_running"],
        requests_waiting=summed["requests_waiting"],
        preemptions_total=summed["preemptions_total"],
        observed_at=observed_at,
    )


def _cache_config(samples: Iterable[Sample]) -> EngineCacheConfig | None:
    """Sizes are summed over engines (each data-parallel engine owns a pool); the rest: first."""
    found = list(samples)
    if not found:
        return None

    def total(label: str) -> int | None:
        numbers = [_int(s.labels.get(label)) for s in found]
        return None if any(n is None for n in numbers) else sum(n for n in numbers if n is not None)

    first = found[0].labels
    return EngineCacheConfig(
        num_gpu_blocks=total("num_gpu_blocks"),
        block_size=_int(first.get("block_size")),
        kv_cache_size_tokens=total("kv_cache_size_tokens"),
        kv_cache_memory_bytes=total("kv_cache_memory_bytes"),
        cache_dtype=_label(first.get("cache_dtype")),
        gpu_memory_utilization=_float(first.get("gpu_memory_utilization")),
    )


def _label(value: str | None) -> str | None:
    return None if value in (None, "", "None") else value


def _int(value: str | None) -> int | None:
    number = _float(value)
    return None if number is None else int(number)


def _float(value: str | None) -> float | None:
    text = _label(value)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def served_model_of(body: Any) -> str | None:
    """The first model id of an OpenAI ``/v1/models`` answer."""
    data = body.get("data") if isinstance(body, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        name = data[0].get("id")
        return name if isinstance(name, str) else None
    return None


class VllmMetricsProbe:
    """Fetches ``url`` (the engine's /metrics) over one kept-alive session: ``session``, or one of
    its own opened on the first read and closed by ``close()``."""

    def __init__(
        self,
        url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.monotonic,
        timeout_s: float = 2.0,
        models_url: str | None = None,
    ) -> None:
        self._url = url
        self._models_url = models_url
        self._served: str | None = None
        self._session = session
        self._owned: aiohttp.ClientSession | None = None
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def read(self) -> EngineReading:
        """Scrape and parse; an unreachable or failing engine raises ProbeTemporaryError."""
        text = await self._fetch(self._url)
        try:
            reading = parse_metrics(text, self._clock())
        except ValueError as exc:
            msg = f"engine metrics at {self._url} are not Prometheus text: {exc}"
            raise ProbeTemporaryError(msg) from exc
        return dataclasses.replace(reading, served_model=await self._served_model())

    async def close(self) -> None:
        """Close the session this probe opened (a session it was given is its owner's)."""
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.close()

    async def _served_model(self) -> str | None:
        """The engine's model name, asked once (until an answer); a failure is not an error."""
        if self._served is None and self._models_url is not None:
            try:
                self._served = served_model_of(json.loads(await self._fetch(self._models_url)))
            except (ProbeTemporaryError, ValueError):
                return None
        return self._served

    def _client(self) -> aiohttp.ClientSession:
        if self._session is not None:
            return self._session
        if self._owned is None or self._owned.closed:
            self._owned = aiohttp.ClientSession()
        return self._owned

    async def _fetch(self, url: str) -> str:
        try:
            async with self._client().get(url, timeout=self._timeout) as response:
                if response.status != 200:
                    msg = f"engine at {url} answered HTTP {response.status}"
                    raise ProbeTemporaryError(msg)
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            msg = f"engine at {url} unreachable: {exc or type(exc).__name__}"
            raise ProbeTemporaryError(msg) from exc
