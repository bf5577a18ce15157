"""The one table of configuration warnings: what the sidecar reports when its inputs disagree.

A warning stands while its condition holds; ``/capacity`` lists it, ``sidecar_config_warning``
reads 1 for its code (0 for every other code in the table), and the control loop logs one
``config_warning_raised`` when it appears and one ``config_warning_cleared`` when it goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

WarningCode = Literal[
    "model_mismatch",
    "no_capacity",
    "adaptive_unsupported",
    "engine_process_unseen",
    "engine_headroom",
]

RAISED_EVENT = "config_warning_raised"
CLEARED_EVENT = "config_warning_cleared"

# code -> what it means, for docs and alert descriptions; each warning's message adds the numbers.
WARNING_CODES: Mapping[WarningCode, str] = {
    "model_mismatch": "the model config's KV bytes per token disagree with the engine's own; "
    "the engine's numbers are used",
    "no_capacity": "the KV pool cannot hold one request of the token budget: 0 permits",
    "adaptive_unsupported": "over-commit needs an engine that preempts: without one, adaptive "
    "admission prices every request at its worst case (tokens mode) and slo admission holds its "
    "limit to the worst-case permits",
    "engine_process_unseen": "NVML lists no process that can be the engine while the engine "
    "answers; the NVML cross-check (or the measured overhead) is skipped, readiness is kept",
    "engine_headroom": "other processes hold more of a GPU than the engine's memory fraction "
    "leaves free: the engine's pool is unchanged, its headroom is gone",
}


@dataclass(frozen=True, slots=True)
class ConfigWarning:
    """One standing warning: its code (a key of WARNING_CODES) and a message with the numbers."""

    code: WarningCode
    message: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as /capacity lists it."""
        return {"code": self.code, "message": self.message}


def model_mismatch(config_bytes: int, engine_bytes: int, tolerance: float) -> ConfigWarning:
    """The model config prices a token at ``config_bytes``, the engine at ``engine_bytes``."""
    return ConfigWarning(
        "model_mismatch",
        f"SIDECAR_MODEL gives {config_bytes:,} KV bytes/token, the engine's cache_config_info "
        f"{engine_bytes:,} (beyond the {tolerance:.0%} tolerance): planning with the engine's",
    )


def no_capacity(pool_tokens: int, request_tokens: int, alpha: float) -> ConfigWarning:
    """The arithmetic of a plan of 0 permits."""
    return ConfigWarning(
        "no_capacity",
        f"0 permits: a KV pool of {pool_tokens:,} tokens x alpha {alpha} holds "
        f"{pool_tokens * alpha:,.0f} tokens, less than one request of {request_tokens:,} tokens "
        "(lower SIDECAR_MAX_PROMPT_TOKENS / SIDECAR_MAX_COMPLETION_TOKENS, or give the engine "
        "more KV)",
    )


# What each closed-loop mode does instead of over-committing, as the warning's message says it.
NO_OVERCOMMIT: Mapping[str, str] = {
    "adaptive": "adaptive admission falls back to tokens",
    "slo": "slo admission holds its limit to the worst-case permits",
}


def adaptive_unsupported(reason: str, mode: str = "adaptive") -> ConfigWarning:
    """A closed-loop mode (adaptive, slo) fell back to worst-case pricing, and why."""
    return ConfigWarning("adaptive_unsupported", f"{NO_OVERCOMMIT[mode]}: {reason}")


def engine_process_unseen(
    gpus: list[str], engine_pid: int | None, largest: int, weights_per_gpu: int
) -> ConfigWarning:
    """NVML lists no process on ``gpus`` that can be the engine's."""
    if engine_pid is not None:
        why = f"SIDECAR_ENGINE_PID {engine_pid} is not among the processes NVML lists"
    elif largest == 0:
        why = "NVML lists no process at all"
    else:
        why = (
            f"the largest process NVML lists holds {largest:,} B, less than the weights alone "
            f"({weights_per_gpu:,} B per GPU)"
        )
    return ConfigWarning(
        "engine_process_unseen",
        f"the engine answers, but on {', '.join(gpus)} {why}: NVML lost sight of its process "
        "(another PID namespace, a restarted driver) or the engine freed its memory (sleep "
        "mode). The cross-check against NVML is skipped; readiness follows the engine's HTTP",
    )


def engine_headroom(gpu: str, others: int, left_free: int, fraction: float) -> ConfigWarning:
    """Other processes on ``gpu`` hold ``others`` bytes where the engine leaves ``left_free``."""
    return ConfigWarning(
        "engine_headroom",
        f"on {gpu} other processes hold {others:,} B, more than the {left_free:,} B the engine's "
        f"memory fraction {fraction} leaves free: {others - left_free:,} B of the engine's share "
        "is taken. Its KV pool stays allocated, but its activations can run out of memory, and "
        "vLLM would refuse to start now (free memory below total x gpu_memory_utilization)",
    )


def changes(
    old: tuple[ConfigWarning, ...], new: tuple[ConfigWarning, ...]
) -> tuple[tuple[ConfigWarning, ...], tuple[ConfigWarning, ...]]:
    """(raised, cleared) between two sets of standing warnings, compared by code."""
    old_codes = {w.code for w in old}
    new_codes = {w.code for w in new}
    raised = tuple(w for w in new if w.code not in old_codes)
    cleared = tuple(w for w in old if w.code not in new_codes)
    return raised, cleared
