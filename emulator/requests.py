"""Validate an OpenAI generation request body into what the emulated engine needs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from emulator import tokens
from emulator.config import EmulatorConfig

Kind = Literal["chat", "completion"]


class InvalidRequestError(ValueError):
    """The body is not a request the engine accepts; maps to an OpenAI-shaped 4xx."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


@dataclass(frozen=True)
class Generation:
    """One validated generation request."""

    kind: Kind
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool


def parse_generation(body: Any, kind: Kind, config: EmulatorConfig) -> Generation:
    """Check the body like vLLM does (model name, prompt, token budget) and count the prompt."""
    if not isinstance(body, Mapping):
        raise InvalidRequestError("request body must be a JSON object")
    if body.get("model", config.model_name) != config.model_name:
        raise InvalidRequestError(
            f"The model `{body.get('model')}` does not exist.", status=404, param="model"
        )
    prompt, prompt_tokens = _prompt(body, kind)
    max_tokens = _max_tokens(body, prompt_tokens, config.max_model_len)
    stream_options = body.get("stream_options") or {}
    return Generation(
        kind=kind,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=body.get("stream") is True,
        include_usage=isinstance(stream_options, Mapping)
        and stream_options.get("include_usage") is True,
    )


def _prompt(body: Mapping[str, Any], kind: Kind) -> tuple[str, int]:
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequestError("messages must be a non-empty list", param="messages")
        if not all(isinstance(message, Mapping) for message in messages):
            raise InvalidRequestError("each message must be an object", param="messages")
        return tokens.chat_prompt_text(messages), len(tokens.chat_token_ids(messages))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or tokens.count_text(prompt) == 0:
        raise InvalidRequestError("prompt must be a non-empty string", param="prompt")
    return prompt, tokens.count_text(prompt)


def _max_tokens(body: Mapping[str, Any], prompt_tokens: int, max_model_len: int) -> int:
    room = max_model_len - prompt_tokens
    requested = body.get("max_completion_tokens", body.get("max_tokens"))
    if requested is None:
        requested = room
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise InvalidRequestError("max_tokens must be a positive integer", param="max_tokens")
    if room < 1 or requested > room:
        raise InvalidRequestError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the messages, "
            f"{requested} in the completion). Please reduce the length of the messages or "
            "completion.",
            param="max_tokens",
        )
    return int(requested)
