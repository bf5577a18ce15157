"""The per-request token budget: what the engine itself accepts, narrowed by settings (pure).

With the engine's ``max_model_len`` known, a request may hold what the engine would serve: a prompt
and a completion of up to ``max_model_len`` tokens each, never more than ``max_model_len`` together.
``SIDECAR_MAX_PROMPT_TOKENS`` / ``SIDECAR_MAX_COMPLETION_TOKENS`` only narrow that. Without the
engine's figure (not answered yet, or an engine that does not say), the settings stand alone, and
where unset the fallbacks below, so a plan can still be made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sidecar.core.plan.capacity import Budget

FALLBACK_PROMPT_TOKENS = 3000
FALLBACK_COMPLETION_TOKENS = 1000

# setting: a SIDECAR_MAX_* value; engine: the engine's max_model_len; fallback: neither is known.
Origin = Literal["setting", "engine", "fallback"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenBudget:
    """The budget in force and where each half of it came from."""

    prompt_tokens: int
    completion_tokens: int
    context_tokens: int | None  # the engine's max_model_len, where known
    prompt_origin: Origin
    completion_origin: Origin

    @property
    def total_tokens(self) -> int:
        """The most one sequence can hold: prompt and completion, within the engine's context."""
        return self.plan_budget().total

    @property
    def fills_max_tokens(self) -> bool:
        """Whether a request without max_tokens gets the completion budget written in.

        Not where the budget is the engine's own: the engine then fills in what its context has
        left after the prompt, and a max_tokens of the whole context would make it refuse."""
        return self.completion_origin != "engine"

    def plan_budget(self) -> Budget:
        """The budget the capacity plan prices one request at."""
        return Budget(self.prompt_tokens, self.completion_tokens, self.context_tokens)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for /capacity."""
        return {
            "max_prompt_tokens": self.prompt_tokens,
            "max_completion_tokens": self.completion_tokens,
            "request_max_tokens": self.total_tokens,
            "engine_max_model_len": self.context_tokens,
            "source": {"prompt": self.prompt_origin, "completion": self.completion_origin},
        }


def resolve_budget(
    prompt_setting: int | None, completion_setting: int | None, max_model_len: int | None
) -> TokenBudget:
    """The budget from the settings (None: unset) and the engine's ``max_model_len`` (None:
    unknown)."""
    prompt, prompt_origin = _half(prompt_setting, max_model_len, FALLBACK_PROMPT_TOKENS)
    completion, completion_origin = _half(
        completion_setting, max_model_len, FALLBACK_COMPLETION_TOKENS
    )
    return TokenBudget(
        prompt_tokens=prompt,
        completion_tokens=completion,
        context_tokens=max_model_len,
        prompt_origin=prompt_origin,
        completion_origin=completion_origin,
    )


def _half(setting: int | None, context: int | None, fallback: int) -> tuple[int, Origin]:
    if context is None:
        return (fallback, "fallback") if setting is None else (setting, "setting")
    if setting is None or setting > context:  # a setting narrows the engine's limit, never widens
        return context, "engine"
    return setting, "setting"
