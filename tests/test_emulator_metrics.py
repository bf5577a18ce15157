"""The emulated engine's /metrics text against real vLLM 0.32 output (families and labels)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from emulator.config import EmulatorConfig
from emulator.kv_pool import KVPool
from emulator.metrics import build_registry
from sidecar.live.probes.engine import parse_metrics

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-0.32" / "metrics-after-traffic.txt"
FAMILIES = [
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
]


def samples_by_family(text: str) -> dict[str, tuple[str, list[Sample]]]:
    return {
        family.name: (family.type, family.samples)
        for family in text_string_to_metric_families(text)
    }


@pytest.fixture(scope="module")
def vllm() -> dict[str, tuple[str, list[Sample]]]:
    """Real vLLM 0.32 /metrics, the shape the emulator must match."""
    return samples_by_family(FIXTURE.read_text())


def scrape(config: EmulatorConfig, pool: KVPool) -> dict[str, tuple[str, list[Sample]]]:
    return samples_by_family(generate_latest(build_registry(config, pool.snapshot)).decode())


def make_pool(config: EmulatorConfig) -> KVPool:
    return KVPool(
        num_blocks=config.num_gpu_blocks,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        oom=config.oom,
    )


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in FAMILIES])
def test_family_type_sample_names_and_labels_match_vllm(
    vllm: dict[str, tuple[str, list[Sample]]], name: str
) -> None:
    """Each family parses to the same type, sample names and label sets as vLLM's."""
    config = EmulatorConfig(model_name="tiny-llama")
    ours = scrape(config, make_pool(config))[name]
    theirs = vllm[name]
    assert ours[0] == theirs[0]
    assert {s.name for s in ours[1]} == {
        s.name for s in theirs[1] if not s.name.endswith("_created")
    }
    assert sorted(s.labels.items() for s in ours[1]) == sorted(
        s.labels.items() for s in theirs[1] if not s.name.endswith("_created")
    )


def test_cache_config_info_carries_vllms_kv_figures(
    vllm: dict[str, tuple[str, list[Sample]]],
) -> None:
    """cache_config_info has vLLM's labels (engine, no model_name) with the pool's numbers."""
    config = EmulatorConfig(max_model_len=1024, kv_tokens=1048576, block_size=128)
    (ours,) = scrape(config, make_pool(config))["vllm:cache_config_info"][1]
    (theirs,) = vllm["vllm:cache_config_info"][1]
    assert set(ours.labels) <= set(theirs.labels)
    # The tiny fixture model (1024 bytes/token) with the same pool reads exactly like vLLM.
    for label in (
        "block_size",
        "num_gpu_blocks",
        "kv_cache_size_tokens",
        "kv_cache_memory_bytes",
        "kv_cache_max_concurrency",
        "engine",
        "cache_dtype",
    ):
        assert ours.labels[label] == theirs.labels[label], label
    assert ours.value == 1.0


def test_gauges_follow_the_pool() -> None:
    """Running, waiting, usage and counters reflect the pool at scrape time."""
    config = EmulatorConfig(max_model_len=16, kv_tokens=64, block_size=16, max_num_seqs=1)
    pool = make_pool(config)
    pool.submit("a", 20, 5)
    pool.submit("b", 1, 5)
    pool.step()  # a's prompt, 2 blocks, and its first token; b waits (max_num_seqs=1)
    values = {
        s.name: s.value
        for _, samples in scrape(config, pool).values()
        for s in samples
        if "finished_reason" not in s.labels
    }
    assert values["vllm:num_requests_running"] == 1
    assert values["vllm:num_requests_waiting"] == 1
    assert values["vllm:kv_cache_usage_perc"] == 0.5
    assert values["vllm:prompt_tokens_total"] == 20
    assert values["vllm:generation_tokens_total"] == 1


def test_finished_lengths_read_back_as_the_engines_typical_request() -> None:
    """Two requests of 20 + 5 and 1 + 5 tokens finished: the sidecar's probe reads a typical
    request of 10.5 prompt and 5 generated tokens from the length histograms' sums and counts,
    as it does from vLLM's."""
    config = EmulatorConfig(max_model_len=64, kv_tokens=256, block_size=16)
    pool = make_pool(config)
    pool.submit("a", 20, 5)
    pool.submit("b", 1, 5)
    for _ in range(10):
        pool.step()
    text = generate_latest(build_registry(config, pool.snapshot)).decode()
    reading = parse_metrics(text, 0.0)
    assert (reading.typical_prompt_tokens, reading.typical_generation_tokens) == (10.5, 5.0)


def test_the_time_requests_ran_reads_back_as_the_engines_mean() -> None:
    """vLLM's request_inference_time_seconds, sum over count: the sidecar's probe reads the mean
    time a request ran, the Retry-After hint's pace before the sidecar has served any."""
    config = EmulatorConfig(max_model_len=64, kv_tokens=256, block_size=16)
    pool = make_pool(config)
    pool.submit("a", 20, 5)
    pool.submit("b", 1, 5)
    for _ in range(10):
        pool.step()
    snap = replace(pool.snapshot(), finished_inference_s=3.0)
    text = generate_latest(build_registry(config, lambda: snap)).decode()
    assert parse_metrics(text, 0.0).typical_inference_s == 1.5
