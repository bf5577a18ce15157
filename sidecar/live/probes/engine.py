"""vLLM's ``/metrics`` read into the engine-neutral reading: its KV cache configuration and load.

:func:`parse_metrics` is pure (text in, reading out, parsed by ``prometheus_client.parser``);
:mod:`sidecar.live.probes.engine_probe` fetches the text. The Prometheus helpers here
(:func:`samples_of`, :func:`unread_lines`) serve the other engines' dialects too.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sidecar.live.probes import EngineCacheConfig, EngineReading

_SUMMED = {
    "vllm:kv_cache_usage_perc": "kv_usage_ratio",
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:num_preemptions_total": "preemptions_total",
}


# Histograms of finished requests whose mean (sum / count) primes the learned lengths, and the
# time a request holds its place (the Retry-After hint's pace).
_MEANS = {
    "vllm:request_prompt_tokens": "typical_prompt_tokens",
    "vllm:request_generation_tokens": "typical_generation_tokens",
    "vllm:request_inference_time_seconds": "typical_inference_s",
}
# The histogram whose buckets say how long requests hold their place, not only its mean: the
# Retry-After hint's forecast of when places free (sidecar.core.admission.frees_forecast).
_HOLDS = "vllm:request_inference_time_seconds"
HOLD_QUANTILES = 16
_CACHE_INFO = "vllm:cache_config_info"
# Family and sample names the probe reads; a counter's family may be named without its _total.
_WANTED = frozenset(
    {
        *_SUMMED,
        _CACHE_INFO,
        "vllm:num_preemptions",
        *(name + part for name in _MEANS for part in ("", "_sum", "_count")),
        _HOLDS + "_bucket",
    }
)
_NAME_CHARS = "a-zA-Z0-9_:"


def unread_lines(wanted: Iterable[str]) -> re.Pattern[str]:
    """A sample, HELP or TYPE line of a family not in ``wanted``, with its newline. A line is
    kept when its name (the longest run of name characters) is wanted, or when it does not start
    with a name: a comment, a blank line, or text that is not Prometheus at all."""
    return re.compile(
        rf"^(?:# (?:HELP|TYPE) )?"
        rf"(?!(?:{'|'.join(map(re.escape, sorted(wanted)))})(?![{_NAME_CHARS}]))"
        rf"[a-zA-Z_:][{_NAME_CHARS}]*.*\n?",
        re.MULTILINE,
    )


_UNREAD_LINE = unread_lines(_WANTED)
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
    samples = samples_of(_CACHE_INFO_SAMPLE.sub("", kept))
    return _reading(samples, _cache_config_of(info), observed_at)


def parse_families(text: str, observed_at: float) -> EngineReading:
    """:func:`parse_metrics` without dropping the families it never reads first."""
    samples = samples_of(text)
    return _reading(
        samples, _cache_config(s for s in samples if s.name == _CACHE_INFO), observed_at
    )


def samples_of(text: str) -> list[Sample]:
    """Every sample of the exposition text, parsed by ``prometheus_client.parser``."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


@functools.lru_cache(maxsize=8)
def _cache_config_of(lines: tuple[str, ...]) -> EngineCacheConfig | None:
    """The cache configuration in these sample lines; the parser's ValueError is never kept."""
    return _cache_config(s for s in samples_of("".join(lines)) if s.name == _CACHE_INFO)


def _reading(
    samples: list[Sample], cache: EngineCacheConfig | None, observed_at: float
) -> EngineReading:
    values: dict[str, list[float]] = {field: [] for field in _SUMMED.values()}
    for sample in samples:
        if sample.name in _SUMMED:
            values[_SUMMED[sample.name]].append(sample.value)
    usage = values.pop("kv_usage_ratio")
    summed = {field: (sum(v) if v else None) for field, v in values.items()}
    means = histogram_means(samples, _MEANS)
    return EngineReading(
        cache=cache,
        kv_usage_ratio=sum(usage) / len(usage) if usage else None,
        requests_running=summed["requests_running"],
        requests_waiting=summed["requests_waiting"],
        preemptions_total=summed["preemptions_total"],
        observed_at=observed_at,
        typical_prompt_tokens=means.get("typical_prompt_tokens"),
        typical_generation_tokens=means.get("typical_generation_tokens"),
        typical_inference_s=means.get("typical_inference_s"),
        inference_quantiles_s=histogram_quantiles(samples, _HOLDS, HOLD_QUANTILES),
    )


def histogram_quantiles(samples: Iterable[Sample], family: str, count: int) -> tuple[float, ...]:
    """``count`` evenly spaced quantiles ((i + 0.5) / count) of ``family``'s histogram, its
    buckets summed over engines, each interpolated linearly within its bucket as Prometheus's
    ``histogram_quantile`` does (a quantile in the +Inf bucket is the highest finite bound);
    empty where the histogram has counted nothing or has no finite bucket."""
    within: dict[float, float] = {}
    name = family + "_bucket"
    for sample in samples:
        label = sample.labels.get("le")
        if sample.name == name and label is not None:
            le = float(label)
            within[le] = within.get(le, 0.0) + sample.value
    bounds = sorted(within)
    total = within.get(math.inf, 0.0)
    finite = [b for b in bounds if math.isfinite(b)]
    if total <= 0 or not finite:
        return ()
    quantiles: list[float] = []
    for i in range(count):
        rank = (i + 0.5) / count * total
        lower, below = 0.0, 0.0
        for bound in finite:
            cumulative = within[bound]
            if cumulative >= rank:
                share = (rank - below) / (cumulative - below) if cumulative > below else 1.0
                quantiles.append(lower + (bound - lower) * share)
                break
            lower, below = bound, cumulative
        else:
            quantiles.append(finite[-1])
    return tuple(quantiles)


def histogram_means(samples: Iterable[Sample], families: dict[str, str]) -> dict[str, float]:
    """field -> sum / count of each histogram family in ``families`` (summed over engines) that
    has counted anything."""
    totals: dict[str, list[float]] = {}
    for sample in samples:
        family, _, part = sample.name.rpartition("_")
        if family in families and part in ("sum", "count"):
            pair = totals.setdefault(families[family], [0.0, 0.0])
            pair[part == "count"] += sample.value
    return {field: total / count for field, (total, count) in totals.items() if count > 0}


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
