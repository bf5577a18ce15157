"""The emulated engine's /metrics: vLLM's family names and labels, read from the pool at scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from emulator.config import EmulatorConfig
from emulator.kv_pool import Snapshot

ENGINE = "0"


class EngineCollector(Collector):
    """Builds the vLLM families from a fresh pool snapshot on every scrape."""

    def __init__(self, config: EmulatorConfig, snapshot: Callable[[], Snapshot]) -> None:
        self._config = config
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Yield the families in the fixture's order."""
        snap = self._snapshot()
        labels = ["engine", "model_name"]
        values = [ENGINE, self._config.model_name]
        gauges = (
            ("vllm:num_requests_running", "Number of requests in model execution batches.",
             snap.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
             snap.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             snap.kv_usage),
        )  # fmt: skip
        for name, documentation, value in gauges:
            gauge = GaugeMetricFamily(name, documentation, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        counters = (
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
             snap.preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", snap.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.",
             snap.generation_tokens),
        )  # fmt: skip
        for name, documentation, value in counters:
            if name == "vllm:num_preemptions" and self._config.oom:
                continue  # an engine that fails on overflow never preempts: no such series
            counter = CounterMetricFamily(name, documentation, labels=labels)
            counter.add_metric(values, value)
            yield counter
        yield self._success(snap)
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


def build_registry(config: EmulatorConfig, snapshot: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry of its own, so several emulators can share one process."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(config, snapshot))
    return registry
