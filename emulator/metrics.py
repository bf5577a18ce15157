"""The emulated engine's /metrics: vLLM's or SGLang's family names and labels, read from the pool
at scrape (llama.cpp's hand-written text is :mod:`emulator.llamacpp`'s)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from emulator.config import EmulatorConfig
from emulator.kv_pool import INFERENCE_BUCKETS_S, Snapshot

ENGINE = "0"


class EngineCollector(Collector):
    """Builds the vLLM families from a fresh pool snapshot on every scrape."""

    def __init__(self, config: EmulatorConfig, snapshot: Callable[[], Snapshot]) -> None:
        self._config = config
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """Yield the families in the fixture's order."""
        snap = self._snapshot()
        labels = ["engine", "model_name"]
        values = [ENGINE, self._config.model_name]
        gauges = (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                snap.running,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                snap.waiting,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                snap.kv_usage,
            ),
        )
        for name, documentation, value in gauges:
            gauge = GaugeMetricFamily(name, documentation, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        counters = (
            (
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine.",
                snap.preemptions,
            ),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", snap.prompt_tokens),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                snap.generation_tokens,
            ),
        )
        for name, documentation, value in counters:
            if name == "vllm:num_preemptions" and self._config.fails_on_overflow:
                continue  # an engine that fails on overflow never preempts: no such series
            counter = CounterMetricFamily(name, documentation, labels=labels)
            counter.add_metric(values, value)
            yield counter
        yield self._success(snap)
        yield from self._lengths(snap)
        yield self._cache_config_info()

    def _success(self, snap: Snapshot) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=["engine", "finished_reason", "model_name"],
        )
        for reason, count in snap.finished.items():
            family.add_metric([ENGINE, reason, self._config.model_name], count)
        return family

    def _lengths(self, snap: Snapshot) -> Iterator[HistogramMetricFamily]:
        """vLLM's per-request length and running-time histograms, with their sums and counts
        (the lengths' one +Inf bucket is what a reader of their mean needs; the running time has
        vLLM's own buckets, from which the sidecar reads how long requests hold their place)."""
        count = sum(snap.finished.values())
        for name, documentation, total in (
            (
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                snap.finished_prompt_tokens,
            ),
            (
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                snap.finished_generation_tokens,
            ),
        ):
            family = HistogramMetricFamily(name, documentation, labels=["engine", "model_name"])
            family.add_metric([ENGINE, self._config.model_name], [("+Inf", count)], total)
            yield family
        family = HistogramMetricFamily(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            labels=["engine", "model_name"],
        )
        buckets = [
            (repr(bound), float(within))
            for bound, within in zip(
                INFERENCE_BUCKETS_S, snap.finished_inference_buckets, strict=False
            )
        ]
        family.add_metric(
            [ENGINE, self._config.model_name],
            [*buckets, ("+Inf", count)],
            snap.finished_inference_s,
        )
        yield family

    def _cache_config_info(self) -> GaugeMetricFamily:
        config = self._config
        info = {
            "block_size": str(config.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "False",
            "engine": ENGINE,
            "gpu_memory_utilization": str(config.gpu_memory_utilization),
            "kv_cache_max_concurrency": str(config.kv_cache_max_concurrency),
            "kv_cache_memory_bytes": str(config.kv_cache_memory_bytes),
            "kv_cache_size_tokens": str(config.kv_cache_size_tokens),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(config.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "sliding_window": "None",
        }
        family = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(info),
        )
        family.add_metric(list(info.values()), 1.0)
        return family


class SglangCollector(Collector):
    """SGLang's families (``--enable-metrics``), as SGLang 0.5.23 declares them in
    ``sglang/srt/observability/metrics_collector.py`` (PyPI wheel sglang-0.5.23): one scheduler,
    TP rank 0, no data parallelism, so no ``dp_rank`` label."""

    def __init__(self, config: EmulatorConfig, snapshot: Callable[[], Snapshot]) -> None:
        self._config = config
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The load gauges, the constants emit_constants sets, the retraction counter."""
        snap, config = self._snapshot(), self._config
        used = snap.used_blocks * config.block_size
        gauges = (
            ("sglang:num_running_reqs", "The number of running requests.", snap.running),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", snap.waiting),
            ("sglang:token_usage", "The token usage.", snap.kv_usage),
            ("sglang:num_used_tokens", "The number of used tokens.", used),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                config.kv_cache_size_tokens,
            ),
            (
                "sglang:kv_cache_memory_usage_gb",
                "Memory used by the KV cache pools in GB.",
                config.kv_cache_memory_bytes / 1024**3,
            ),
            ("sglang:page_size", "KV cache page size in tokens.", config.block_size),
            ("sglang:num_pages", "Number of KV cache pages.", config.num_gpu_blocks),
            ("sglang:context_len", "Maximum context length.", config.max_model_len),
        )
        for name, documentation, value in gauges:
            gauge = GaugeMetricFamily(name, documentation, labels=list(self._labels()))
            gauge.add_metric(list(self._labels().values()), value)
            yield gauge
        counters = (
            (
                "sglang:num_retracted_requests",
                "Total number of retracted requests.",
                snap.preemptions,
            ),
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", snap.prompt_tokens),
            (
                "sglang:generation_tokens",
                "Number of generation tokens processed.",
                snap.generation_tokens,
            ),
        )
        for name, documentation, value in counters:
            if name == "sglang:num_retracted_requests" and config.fails_on_overflow:
                continue  # an engine that fails on overflow never retracts: no such series
            counter = CounterMetricFamily(name, documentation, labels=list(self._labels()))
            counter.add_metric(list(self._labels().values()), value)
            yield counter

    def _labels(self) -> dict[str, str]:
        # SchedulerMetricsCollector.init_new's labels, for one unified (not disaggregated) engine.
        return {
            "model_name": self._config.model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }


def build_registry(config: EmulatorConfig, snapshot: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry of its own, so several emulators can share one process."""
    registry = CollectorRegistry(auto_describe=False)
    collector = SglangCollector if config.engine == "sglang" else EngineCollector
    registry.register(collector(config, snapshot))
    return registry
