"""The one table of configuration warnings: what the sidecar reports when its inputs disagree.

A warning stands while its condition holds; ``/capacity`` lists it, ``sidecar_config_warning``
reads 1 for its code (0 for every other code in the table), and the control loop logs one
``config_warning_raised`` when it appears and one ``config_warning_cleared`` when it goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

WarningCode = Literal["model_mismatch", "no_capacity", "adaptive_unsupported"]

RAISED_EVENT = "config_warning_raised"
CLEARED_EVENT = "config_warning_cleared"

# code -> what it means, for docs and alert descriptions; each warning's message adds the numbers.
WARNING_CODES: Mapping[WarningCode, str] = {
    "model_mismatch": "the model config's KV bytes per token disagree with the engine's own; "
    "the engine's numbers are used",
    "no_capacity": "the KV pool cannot hold one request of the token budget: 0 permits",
    "adaptive_unsupported": "SIDECAR_ADMISSION=adaptive needs an engine that preempts; it prices "
    "every request at its worst case (tokens mode) instead",
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


def adaptive_unsupported(reason: str) -> ConfigWarning:
    """Adaptive admission fell back to worst-case pricing, and why."""
    return ConfigWarning(
        "adaptive_unsupported", f"adaptive admission falls back to tokens: {reason}"
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
