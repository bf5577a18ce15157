"""SGLang's ``/metrics`` (``--enable-metrics``) read into the engine-neutral reading.

Names, types, labels and units as SGLang 0.5.23 declares them (PyPI wheel sglang-0.5.23:
``sglang/srt/observability/metrics_collector.py``, ``SchedulerMetricsCollector``; the constants
are set once at start-up by ``Scheduler.emit_metrics_constants``,
``sglang/srt/managers/scheduler.py``).
SGLang has no ``cache_config_info``: its pool is the gauges ``max_total_num_tokens``,
``page_size``, ``num_pages`` and ``kv_cache_memory_usage_gb`` (GiB: its ``GB`` is 1024**3).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.samples import Sample

from sidecar.live.probes import EngineCacheConfig, EngineReading
from sidecar.live.probes.engine import samples_of, unread_lines

GIB = 1024**3

# Each series the reading takes, and the field it fills.
FIELDS = {
    "sglang:max_total_num_tokens": "pool_tokens",
    "sglang:page_size": "page_size",
    "sglang:num_pages": "num_pages",
    "sglang:kv_cache_memory_usage_gb": "kv_gib",
    "sglang:context_len": "context_len",
    "sglang:token_usage": "usage",  # a fraction of the pool, the fullest of full/SWA/Mamba
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:num_retracted_requests_total": "retracted",  # a counter: SGLang's preemption
}
# The retraction counter's family is named without its _total.
_UNREAD_LINE = unread_lines({*FIELDS, "sglang:num_retracted_requests"})


def parse_sglang(text: str, observed_at: float) -> EngineReading:
    """Read SGLang's exposition text; a ValueError when it is not Prometheus text.

    Each data-parallel rank (label ``dp_rank``) owns a pool and a queue: pools and counts are
    summed over ranks, the usage fraction is their mean. Only attention-TP rank 0 reports unless
    ``--enable-metrics-for-all-schedulers``; a rank's first series is taken, so TP ranks that
    repeat the same figures are not counted twice. With priority scheduling the per-priority
    breakdowns carry ``priority="<n>"`` and the total ``priority=""``: only the total is read.
    """
    per_rank = _per_rank(samples_of(_UNREAD_LINE.sub("", text)))
    summed = ("pool_tokens", "num_pages", "kv_gib", "running", "waiting", "retracted")
    total = {name: _sum(per_rank, name) for name in summed}
    usage = [ranks["usage"] for ranks in per_rank.values() if "usage" in ranks]
    page = _first(per_rank, "page_size")
    cache = None
    if total["pool_tokens"] is not None:
        cache = EngineCacheConfig(
            num_gpu_blocks=_int(total["num_pages"]),
            block_size=_int(page),
            kv_cache_size_tokens=_int(total["pool_tokens"]),
            kv_cache_memory_bytes=None if total["kv_gib"] is None else round(total["kv_gib"] * GIB),
            cache_dtype=None,
            gpu_memory_utilization=None,
        )
    return EngineReading(
        cache=cache,
        kv_usage_ratio=sum(usage) / len(usage) if usage else None,
        requests_running=total["running"],
        requests_waiting=total["waiting"],
        preemptions_total=total["retracted"],
        observed_at=observed_at,
        provenance="sglang",
        engine="sglang",
        max_model_len=_int(_first(per_rank, "context_len")),
    )


def _per_rank(samples: Iterable[Sample]) -> dict[str, dict[str, float]]:
    """field -> value per data-parallel rank, the first series of each rank, totals only."""
    ranks: dict[str, dict[str, float]] = {}
    for sample in samples:
        field = FIELDS.get(sample.name)
        if field is None or sample.labels.get("priority", ""):
            continue
        ranks.setdefault(sample.labels.get("dp_rank", ""), {}).setdefault(field, sample.value)
    return ranks


def _sum(per_rank: dict[str, dict[str, float]], field: str) -> float | None:
    values = [ranks[field] for ranks in per_rank.values() if field in ranks]
    return sum(values) if values else None


def _first(per_rank: dict[str, dict[str, float]], field: str) -> float | None:
    return next((ranks[field] for ranks in per_rank.values() if field in ranks), None)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
