"""The raw HTTP/1.1 requests issue 48's attacks send: pipelined GETs and streamed chats, request
bodies in tiny chunks. Shared by the functional tests and :mod:`benchmarks.audit_attacks`."""

from __future__ import annotations

import json

CHUNKED_HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def get(i: int) -> bytes:
    """``GET /v1/models``, its X-Request-Id ``r<i>``."""
    return f"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Request-Id: r{i}\r\n\r\n".encode()


def chat(i: int, model: str = "m", max_tokens: int | None = None) -> bytes:
    """A streamed chat completion, its X-Request-Id ``r<i>``."""
    fields: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    body = json.dumps(fields)
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: r{i}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


def completion(padding: int, model: str = "m") -> bytes:
    """A completion request's JSON body, padded with ``padding`` spaces."""
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 4}).encode()
    return body + b" " * padding


def completion_head(length: int) -> bytes:
    """The head of a completion request whose body is ``length`` bytes."""
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % length
    )


def chunked(body: bytes, size: int) -> bytes:
    """``body`` in chunks of ``size`` bytes, then the last chunk."""
    pieces = [body[at : at + size] for at in range(0, len(body), size)]
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
