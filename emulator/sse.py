"""vLLM 0.32's server-sent-event chunks for chat and text completions, as bytes on the wire."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from emulator.requests import Kind

DONE = b"data: [DONE]\n\n"
SYSTEM_FINGERPRINT = "emulator-vllm-0.32"


@dataclass(frozen=True)
class Stream:
    """What every chunk of one response repeats."""

    kind: Kind
    id: str
    created: int
    model: str


def event(payload: Any) -> bytes:
    """One ``data:`` event, compact JSON like vLLM's."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def role_chunk(stream: Stream) -> bytes:
    """The first chat chunk: the assistant role and empty content."""
    choice = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    return event(
        _envelope(stream, [choice]) | {"prompt_token_ids": None, "prompt_text": None},
    )


def token_chunk(
    stream: Stream, text: str, finish_reason: str | None = None, *, last: bool = False
) -> bytes:
    """One generated token; the final one carries finish_reason (and the fingerprint if last)."""
    choice: dict[str, Any] = {"index": 0}
    if stream.kind == "chat":
        choice |= {"delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["stop_reason"] = None
    else:
        choice |= {"text": text, "logprobs": None, "finish_reason": finish_reason}
        choice |= {"stop_reason": None, "prompt_token_ids": None}
    choice["token_ids"] = None
    payload = _envelope(stream, [choice])
    if last:
        payload["system_fingerprint"] = SYSTEM_FINGERPRINT
    return event(payload)


def usage_chunk(stream: Stream, prompt_tokens: int, completion_tokens: int) -> bytes:
    """The closing usage chunk sent when stream_options.include_usage is set."""
    payload = _envelope(stream, []) | {
        "usage": usage(prompt_tokens, completion_tokens),
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    return event(payload)


def error_chunk(message: str, error_type: str, code: int) -> bytes:
    """An in-band mid-stream error, the way vLLM reports failures after the 200 went out."""
    return event(error_body(message, error_type, code))


def error_body(message: str, error_type: str, code: int, param: str | None = None) -> Any:
    """vLLM's OpenAI-shaped error object."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The usage object, in vLLM's key order."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def completion_body(
    stream: Stream, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The non-streaming response for either kind."""
    choice: dict[str, Any] = {"index": 0}
    if stream.kind == "chat":
        choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
    else:
        choice["text"] = text
    choice |= {"logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
    return _envelope(stream, [choice]) | {
        "object": "chat.completion" if stream.kind == "chat" else "text_completion",
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage(prompt_tokens, completion_tokens),
    }


def _envelope(stream: Stream, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": stream.id,
        "object": "chat.completion.chunk" if stream.kind == "chat" else "text_completion",
        "created": stream.created,
        "model": stream.model,
        "choices": choices,
    }
