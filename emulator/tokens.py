"""Deterministic stand-in tokenization and text generation (no model, no randomness)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

VOCAB_SIZE = 32000
# A chat template wraps each message in role markers and adds a generation prompt at the end;
# fixed overheads keep chat prompt counts plausible and predictable.
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_FIXED = 3
_TEMPLATE_TOKEN_ID = 1

WORDS = (
    "the", "engine", "streams", "tokens", "while", "its", "cache", "fills", "with", "keys",
    "and", "values", "each", "block", "holds", "sixteen", "of", "them", "so", "a",
    "long", "answer", "pins", "memory", "until", "it", "ends", "or", "client", "leaves",
    "bulkhead", "queue", "permit", "waits", "grants", "gpu", "pool", "request", "prompt", "reply",
)  # fmt: skip


def count_text(text: str) -> int:
    """Tokens in a plain prompt: one per whitespace-separated word."""
    return len(text.split())


def text_token_ids(text: str) -> list[int]:
    """Stable ids for a plain prompt, one per word."""
    return [zlib.crc32(word.encode()) % VOCAB_SIZE for word in text.split()]


def message_text(content: Any) -> str:
    """The text of an OpenAI message content: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def chat_token_ids(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Stable ids for a chat prompt, template overhead included."""
    ids = [_TEMPLATE_TOKEN_ID] * CHAT_TOKENS_FIXED
    for message in messages:
        ids.extend([_TEMPLATE_TOKEN_ID] * CHAT_TOKENS_PER_MESSAGE)
        ids.extend(text_token_ids(message_text(message.get("content"))))
    return ids


def chat_prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The chat prompt flattened to text; it seeds the generated words."""
    return "\n".join(
        f"{message.get('role', '')}: {message_text(message.get('content'))}" for message in messages
    )


def seed_of(prompt: str) -> int:
    """The seed that makes a prompt's answer repeatable."""
    return zlib.crc32(prompt.encode())


def piece(seed: int, index: int) -> str:
    """The text of generated token number ``index`` (a word, space-separated after the first)."""
    word = WORDS[(seed + index * 7919) % len(WORDS)]
    return word if index == 0 else " " + word
