"""What the engine renders into a prompt, estimated from a request's body (pure, no I/O).

A chat template renders far more than the messages' text: each message's ``name``, its tool calls
and their arguments, the ``tools`` on offer (their JSON schema), ``documents``; the Responses API
renders ``instructions`` and every input item (``function_call`` arguments and outputs included).
Text is priced at a configured number of UTF-8 bytes per token. An image, a video or an audio clip
is priced at a configured figure (what the encoder makes of it), never by its base64 bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from sidecar.core.errors import RequestError

Endpoint = Literal["chat", "completions", "responses"]
# Chat templates add a few tokens per message (role markers, separators).
MESSAGE_OVERHEAD_TOKENS = 4
# A part the engine hands to its encoder rather than its tokenizer (OpenAI's, vLLM's names).
MEDIA_TYPES = frozenset(
    {
        "image_url",
        "input_image",
        "image",
        "image_pil",
        "image_embeds",
        "video_url",
        "video",
        "input_audio",
        "audio_url",
        "audio",
    }
)
# A content part rendered as its text (an assistant's refusal part as its refusal); a part of any
# other type that is not media is priced by every string it holds, as if rendered whole.
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal"})
# A message's structure, which the per-message overhead prices; every other string is rendered.
STRUCTURAL_KEYS = frozenset({"role", "type", "content"})
# Request fields a chat template renders as JSON (tool schemas, RAG documents, template inputs).
RENDERED_AS_JSON = ("tools", "functions", "documents", "chat_template_kwargs")


@dataclass(frozen=True, slots=True)
class PromptRates:
    """How text and media are priced in prompt tokens."""

    bytes_per_token: float = 4.0
    media_tokens: int = 1600


def estimate_prompt(
    body: dict[str, Any], endpoint: Endpoint, rates: PromptRates
) -> tuple[int, int, str]:
    """The largest prompt's estimated tokens, how many prompts there are, and their field;
    RequestError where the prompt's shape is not one the engine takes."""
    if endpoint == "chat":
        return _chat_tokens(body, rates), 1, "messages"
    if endpoint == "responses":
        return _responses_tokens(body, rates), 1, "input"
    tokens, prompts = _completion_tokens(body, rates)
    return tokens, prompts, "prompt"


def _chat_tokens(body: dict[str, Any], rates: PromptRates) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array", param="messages")
    total = _rendered_json_tokens(body, rates)
    for message in messages:
        if not isinstance(message, dict):
            raise RequestError("each message must be an object", param="messages")
        total += _item_tokens(message, "messages", rates)
    return total


def _responses_tokens(body: dict[str, Any], rates: PromptRates) -> int:
    """``instructions`` plus ``input``, a string or an array of input items (messages, function
    calls and their outputs, reasoning)."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("'instructions' must be a string", param="instructions")
    total = _rendered_json_tokens(body, rates) + text_tokens(instructions or "", rates)
    given = body.get("input")
    if isinstance(given, str):
        return total + text_tokens(given, rates)
    if not isinstance(given, list) or not given:
        raise RequestError("'input' must be a string or a non-empty array", param="input")
    for item in given:
        if not isinstance(item, dict):
            raise RequestError("each input item must be an object", param="input")
        total += _item_tokens(item, "input", rates)
    return total


def _item_tokens(item: dict[str, Any], param: str, rates: PromptRates) -> int:
    """A message or input item: its content, every other string it holds (name, tool calls and
    their arguments, a call's output...), its media, and the template's overhead."""
    size, media = _content(item.get("content"), param)
    others = {key: value for key, value in item.items() if key not in STRUCTURAL_KEYS}
    rest, more_media = _strings_and_media(others)
    tokens = text_tokens_of_bytes(size, rates) + text_tokens_of_bytes(rest, rates)
    return MESSAGE_OVERHEAD_TOKENS + tokens + (media + more_media) * rates.media_tokens


def _content(content: object, param: str) -> tuple[int, int]:
    """The UTF-8 bytes a message's content renders and how many media parts it holds."""
    if content is None or isinstance(content, str):
        return _utf8_size(content or ""), 0
    if not isinstance(content, list):
        raise RequestError("message 'content' must be a string or an array", param=param)
    size, media = 0, 0
    for part in content:
        if isinstance(part, dict) and _is_media(part):
            media += 1
        else:
            part_size, part_media = _part_size(part, param)
            size, media = size + part_size, media + part_media
    return size, media


def _part_size(part: object, param: str) -> tuple[int, int]:
    """A content part is an object (``{"type": "text", "text": ...}``...); vLLM also takes a bare
    string as a text part. Anything else never reaches the engine. A part of a type the estimate
    does not know costs every string (and media part) it holds: the engine may render it all."""
    if isinstance(part, str):
        return _utf8_size(part), 0
    if not isinstance(part, dict):
        raise RequestError(
            "each item of a message's 'content' array must be an object (a content part)",
            param=param,
            code="invalid_type",
        )
    if part.get("type") not in TEXT_PART_TYPES:
        return _strings_and_media({k: v for k, v in part.items() if k != "type"})
    text = part.get("text")
    if text is not None and not isinstance(text, str):
        raise RequestError("a content part's 'text' must be a string", param=param)
    refusal = part.get("refusal")  # an assistant's refusal part is rendered as its text
    return _utf8_size((text or "") + (refusal if isinstance(refusal, str) else "")), 0


def _utf8_size(text: str) -> int:
    # surrogatepass: a lone surrogate was refused already, but pricing must never crash on one.
    return len(text.encode("utf-8", "surrogatepass"))


def _is_media(part: dict[str, Any]) -> bool:
    kind = part.get("type")
    return (isinstance(kind, str) and kind in MEDIA_TYPES) or any(k in part for k in MEDIA_TYPES)


def _strings_and_media(value: object) -> tuple[int, int]:
    """The UTF-8 bytes of every string (and number) under ``value``, and the media parts in it;
    a walk with its own stack, so a body nested as deep as the parser allows costs no recursion."""
    size, media = 0, 0
    for leaf in _leaves(value):
        if leaf is None:
            media += 1
        else:
            size += leaf
    return size, media


def _leaves(value: object) -> Iterator[int | None]:
    """Bytes of each string or number leaf; None for each media part (not descended into)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield len(item.encode("utf-8", "surrogatepass"))
        elif isinstance(item, dict):
            if _is_media(item):
                yield None
                continue
            stack.extend(v for k, v in item.items() if k not in STRUCTURAL_KEYS or k == "content")
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, int | float) and not isinstance(item, bool):
            yield len(str(item))


def _rendered_json_tokens(body: dict[str, Any], rates: PromptRates) -> int:
    """Tools, functions, documents and template inputs: a template renders them as JSON."""
    size = 0
    for key in RENDERED_AS_JSON:
        value = body.get(key)
        if value is None:
            continue
        try:
            rendered = json.dumps(value, ensure_ascii=False)
        except (RecursionError, ValueError) as exc:
            raise RequestError(f"'{key}' is nested too deeply", param=key) from exc
        size += len(rendered.encode("utf-8", "surrogatepass"))
    return text_tokens_of_bytes(size, rates)


def _completion_tokens(body: dict[str, Any], rates: PromptRates) -> tuple[int, int]:
    """A completions prompt is text, token ids, or a batch of either (one sequence each)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return text_tokens(prompt, rates), 1
    if isinstance(prompt, list) and prompt:
        if all(_is_token_id(item) for item in prompt):
            return len(prompt), 1
        if all(isinstance(item, str) for item in prompt):
            return max(text_tokens(item, rates) for item in prompt), len(prompt)
        if all(isinstance(item, list) and all(map(_is_token_id, item)) for item in prompt):
            return max(len(item) for item in prompt), len(prompt)
    raise RequestError(
        "'prompt' must be a string, an array of strings, or token ids", param="prompt"
    )


def _is_token_id(item: object) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


def text_tokens(text: str, rates: PromptRates) -> int:
    """Estimated tokens of ``text``."""
    return text_tokens_of_bytes(_utf8_size(text), rates)


def text_tokens_of_bytes(size: int, rates: PromptRates) -> int:
    """Estimated tokens of ``size`` bytes of UTF-8 text."""
    return math.ceil(size / rates.bytes_per_token) if size else 0
