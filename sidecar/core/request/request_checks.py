"""Checks a completion request before admission and fixes its token budget (pure, no I/O).

A request the engine could run past the budget never reaches it: a missing ``max_tokens`` is set to
the completion budget (unless the budget is the engine's own context, which the engine enforces
itself), one above it is refused (or clamped, if configured), and the prompt is estimated from
everything the engine renders into it (:mod:`sidecar.core.request.prompt_estimate`) so
token-weighted admission can price it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from sidecar.core.errors import RequestError
from sidecar.core.request.json_body import parse_object, serialise
from sidecar.core.request.prompt_estimate import (
    MESSAGE_OVERHEAD_TOKENS,
    Endpoint,
    PromptRates,
    estimate_prompt,
)
from sidecar.core.request.tokenize_payload import tokenize_payload

__all__ = ["MESSAGE_OVERHEAD_TOKENS", "Endpoint", "TokenPolicy", "check_request"]
TOKEN_KEYS = ("max_completion_tokens", "max_tokens")
# The Responses API names its completion budget differently and has no `n`.
RESPONSES_TOKEN_KEYS = ("max_output_tokens",)
# Above this many digits a number is not echoed back in an error message.
ECHO_DIGITS = 24


@dataclass(frozen=True, kw_only=True)
class TokenPolicy:
    """The per-request token budget the plan was made for."""

    max_prompt_tokens: int
    max_completion_tokens: int
    over_budget: Literal["reject", "clamp"] = "reject"
    prompt_bytes_per_token: float = 4.0
    # An image, video or audio part: what the engine's encoder makes of it, in prompt tokens.
    media_tokens: int = 1600
    # When the engine counts the prompt, the estimate only prices a request the count could not.
    count_from_engine: bool = False
    # The engine's max_model_len, where known: no sequence is priced past it.
    context_tokens: int | None = None
    # False where the completion budget is the engine's own context: a missing max_tokens stays
    # missing (the engine fills in what the context leaves after the prompt).
    fill_max_tokens: bool = True
    # Where the prompt budget is the engine's own, only an exact count refuses (an estimate might
    # refuse what the engine would serve; the engine refuses what does not fit itself).
    prompt_budget_exact_only: bool = False
    # The engine's KV pool in tokens, where a plan says it: a request whose sequences, each at
    # its worst case, need more is refused (too_large) in every admission mode.
    pool_tokens: int | None = None

    @property
    def rates(self) -> PromptRates:
        """How the estimate prices text and media."""
        return PromptRates(self.prompt_bytes_per_token, self.media_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedRequest:
    """A valid request, ready to admit and forward."""

    body: bytes
    stream: bool
    completion_tokens: int
    prompt_tokens: int
    sequences: int
    model: str | None
    prompt_param: str = "messages"
    tokenize: dict[str, Any] | None = None  # what to ask the engine's /tokenize, when it can say
    clamped: int | None = None  # max_tokens was lowered to this (SIDECAR_OVER_BUDGET=clamp)

    @property
    def total_tokens(self) -> int:
        """The worst case the request can pin: every sequence at its full length."""
        return (self.prompt_tokens + self.completion_tokens) * self.sequences


def check_request(raw: bytes, endpoint: Endpoint, budget: TokenPolicy) -> CheckedRequest:
    """Validate ``raw`` and return it with a bounded token budget; RequestError otherwise."""
    body = parse_object(raw)
    refuse_unpriced(body, endpoint, counted=budget.count_from_engine)
    stream = _optional_bool(body, "stream")
    prompt_tokens, prompts, param = estimate_prompt(body, endpoint, budget.rates)
    tokenize = tokenize_payload(body, endpoint) if budget.count_from_engine else None
    # What the engine will not count (a Responses input, a batch) is bounded by its estimate.
    if tokenize is None and not budget.prompt_budget_exact_only:
        enforce_prompt_budget(prompt_tokens, param, budget)
    keys = RESPONSES_TOKEN_KEYS if endpoint == "responses" else TOKEN_KEYS
    per_prompt, many = _sequences_per_prompt(body, endpoint)
    completion, changed, clamped = _completion_tokens(body, budget, keys)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model", code="invalid_type")
    forwarded = serialise(body) if changed else raw
    prompt_tokens, completion = _within_context(prompt_tokens, completion, budget)
    checked = CheckedRequest(
        body=forwarded,
        stream=stream,
        completion_tokens=completion,
        prompt_tokens=prompt_tokens,
        sequences=per_prompt * prompts,
        model=model,
        prompt_param=param,
        tokenize=tokenize,
        clamped=clamped,
    )
    # An estimate the engine's count replaces (or may not refuse) prices each prompt at 1 token.
    trusted = tokenize is None and not budget.prompt_budget_exact_only
    enforce_pool(checked, budget, many if per_prompt > 1 else param, trusted=trusted)
    return checked


def with_prompt_tokens(checked: CheckedRequest, tokens: int, budget: TokenPolicy) -> CheckedRequest:
    """The request priced with the engine's own prompt count; RequestError if over the budget."""
    enforce_prompt_budget(tokens, checked.prompt_param, budget, exact=True)
    counted = replace(checked, prompt_tokens=min(tokens, budget.context_tokens or tokens))
    enforce_pool(counted, budget, "n")
    return counted


def refuse_unpriced(body: dict[str, Any], endpoint: Endpoint, *, counted: bool) -> None:
    """RequestError for what the engine renders into a prompt that the sidecar cannot price:
    prompt embeddings (a tensor whose length only the engine can read), and a request's own chat
    template unless the engine counts the prompt (a template's loops render any length)."""
    if body.get("prompt_embeds") is not None:
        raise RequestError(
            "'prompt_embeds' cannot be priced here (only the engine can tell how many tokens the "
            "embeddings hold): send the prompt as text or token ids",
            param="prompt_embeds",
            code="unsupported_parameter",
        )
    if body.get("chat_template") is None or endpoint == "completions":
        return  # no template, or none rendered
    if not (counted and endpoint == "chat"):  # only chat prompts go to the engine's count
        raise template_unpriced()


def template_unpriced() -> RequestError:
    """A request's own chat template, with no engine count of what it renders."""
    return RequestError(
        "a request's own 'chat_template' renders a prompt of any length, which this server "
        "cannot estimate: leave it out (the model's template applies), or have the engine count "
        "prompts (SIDECAR_PROMPT_TOKENS=engine)",
        param="chat_template",
        code="unsupported_parameter",
    )


def _sequences_per_prompt(body: dict[str, Any], endpoint: Endpoint) -> tuple[int, str]:
    """How many sequences the engine runs for each prompt (``n``, or ``best_of`` where more: it
    generates that many and returns the best ``n``), and the field that says so."""
    if endpoint == "responses":
        return 1, "n"
    n = _positive_int(body, "n", default=1)
    best_of = _positive_int(body, "best_of", default=n)
    return (best_of, "best_of") if best_of > n else (n, "n")


def enforce_pool(
    checked: CheckedRequest, budget: TokenPolicy, param: str, *, trusted: bool = True
) -> None:
    """RequestError ``too_large`` where the request's sequences, each at its worst case, need
    more tokens than the engine's whole KV pool: no admission mode could ever run it at once.

    One sequence is left to admission (it waits, or the plan holds no request at all: 503).
    ``trusted=False``: the prompt estimate is not the count, so each sequence's prompt is 1 token.
    """
    pool = budget.pool_tokens
    prompt = checked.prompt_tokens if trusted else 1
    worst = (prompt + checked.completion_tokens) * checked.sequences
    if pool is None or checked.sequences == 1 or worst <= pool:
        return
    raise RequestError(
        f"{_shown(checked.sequences)} sequences of up to {prompt + checked.completion_tokens} "
        f"tokens each need {_shown(worst)} tokens of KV cache, more than this server's pool of "
        f"{pool} tokens can ever hold at once: lower n, best_of, the batch, the prompt or "
        "max_tokens",
        param=param,
        code="too_large",
    )


def _within_context(prompt: int, completion: int, budget: TokenPolicy) -> tuple[int, int]:
    """Prompt and completion as priced: the engine never runs a sequence past its context."""
    context = budget.context_tokens
    if context is None:
        return prompt, completion
    prompt = min(prompt, context)
    return prompt, max(1, min(completion, context - prompt))


def enforce_prompt_budget(
    tokens: int, param: str, budget: TokenPolicy, *, exact: bool = False
) -> None:
    if tokens > budget.max_prompt_tokens:
        size = f"{tokens}" if exact else f"about {tokens}"
        raise RequestError(
            f"the prompt is {size} tokens, above this server's prompt budget of "
            f"{budget.max_prompt_tokens} tokens",
            param=param,
            code="prompt_over_budget",
        )


def _optional_bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"'{key}' must be a boolean", param=key, code="invalid_type")
    return value


def _positive_int(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{key}' must be an integer", param=key, code="invalid_type")
    if value <= 0:
        raise RequestError(
            f"'{key}' must be at least 1, got {_shown(value)}", param=key, code="invalid_value"
        )
    return value


def _shown(value: int) -> str:
    """A number as an error message may echo it: huge ones are not repeated back."""
    return str(value) if abs(value) < 10**ECHO_DIGITS else "a number too large to show"


def _completion_tokens(
    body: dict[str, Any], budget: TokenPolicy, keys: tuple[str, ...]
) -> tuple[int, bool, int | None]:
    """The completion budget the engine will honour, whether the body had to change, and the
    value max_tokens was clamped to (None: not clamped)."""
    limit = budget.max_completion_tokens
    largest, over = 0, []  # a loop, not two comprehensions: a frame each, once a request
    for key in keys:
        if body.get(key) is not None:
            value = _positive_int(body, key, 0)
            largest = max(largest, value)
            if value > limit:
                over.append((key, value))
    if not largest:  # none given (a given one is at least 1)
        if not budget.fill_max_tokens:
            return limit, False, None
        body[keys[-1]] = limit
        return limit, True, None
    if not over:
        return largest, False, None
    if budget.over_budget == "reject":
        key, value = over[0]
        raise RequestError(
            f"'{key}' is {_shown(value)}, above this server's completion budget of {limit} tokens",
            param=key,
            code="max_tokens_over_budget",
        )
    for key, _value in over:
        body[key] = limit
    return limit, True, limit
