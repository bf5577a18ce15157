"""The engine's own view: scrape vLLM's ``/metrics`` and read its KV cache configuration and load.

:func:`parse_metrics` is pure (text in, reading out, parsed by ``prometheus_client.parser``);
:class:`VllmMetricsProbe` only fetches the text and translates HTTP failures in one place.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

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
_NAME = re.compile(r"(?:# (?:HELP|TYPE) )?([a-zA-Z_:][a-zA-Z0-9_:]*)")


def relevant_lines(text: str) -> str:
    """The exposition text without the samples, HELP and TYPE lines of families we never read.

    vLLM's /metrics is mostly histograms the probe ignores; parsing only what it reads takes the
    scrape from ~8 ms to well under 1 ms of event-loop time per tick (benchmarks/probe_bench.py).
    Lines that do not start with a metric name are kept, so text that is not Prometheus still
    fails to parse.
    """
    kept = []
    for line in text.splitlines():
        match = _NAME.match(line)
        if match is None or match.group(1) in _WANTED:
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_metrics(text: str, observed_at: float) -> EngineReading:
    """Read vLLM's exposition text; every series is summed over the ``engine`` label.

    The usage ratio is the mean over engines, since each engine's is a fraction of its own pool.
    """
    return parse_families(relevant_lines(text), observed_at)


def parse_families(text: str, observed_at: float) -> EngineReading:
    """:func:`parse_metrics` without dropping the families it never reads first."""
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    values: dict[str, list[float]] = {field: [] for field in _SUMMED.values()}
    for sample in samples:
        if sample.name in _SUMMED:
            values[_SUMMED[sample.name]].append(sample.value)
    usage = values.pop("kv_usage_ratio")
    summed = {field: (sum(v) if v else None) for field, v in values.items()}
    return EngineReading(
        cache=_cache_config(s for s in samples if s.name == _CACHE_INFO),
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
    ) -> None:
        self._url = url
        self._session = session
        self._owned: aiohttp.ClientSession | None = None
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def read(self) -> EngineReading:
        """Scrape and parse; an unreachable or failing engine raises ProbeTemporaryError."""
        text = await self._fetch()
        try:
            return parse_metrics(text, self._clock())
        except ValueError as exc:
            msg = f"engine metrics at {self._url} are not Prometheus text: {exc}"
            raise ProbeTemporaryError(msg) from exc

    async def close(self) -> None:
        """Close the session this probe opened (a session it was given is its owner's)."""
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is not None:
            return self._session
        if self._owned is None or self._owned.closed:
            self._owned = aiohttp.ClientSession()
        return self._owned

    async def _fetch(self) -> str:
        try:
            async with self._client().get(self._url, timeout=self._timeout) as response:
                if response.status != 200:
                    msg = f"engine metrics at {self._url} answered HTTP {response.status}"
                    raise ProbeTemporaryError(msg)
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            msg = f"engine metrics at {self._url} unreachable: {exc or type(exc).__name__}"
            raise ProbeTemporaryError(msg) from exc
