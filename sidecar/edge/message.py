"""What HTTP/1.1 says of any message, for both sides of the edge: which answers carry no body,
which lines cannot be written at all, the one writer of a head (a request's or an answer's), and
the charset a Content-Type names. The refusal at the door is written here too: a whole answer,
head and body, with no request to frame it for."""

from __future__ import annotations

import json
import math
from http import HTTPStatus

from sidecar.core.outcomes import EDGE_FAULTS, EdgeFault, refusal_body

# RFC 9110 §15.3.5 and §15.4.5 (1xx answers, also bodiless, are told apart by their class).
NO_BODY_STATUSES = frozenset({204, 304})
REASONS = {status.value: status.phrase for status in HTTPStatus}


class UnsendableHeadError(ValueError):
    """A line of a head that HTTP/1.1 cannot carry (a line break): never written."""


def holds_line_break(text: str) -> bool:
    """Whether ``text`` (a line of a head, less its separators) holds a CR or LF: written out, it
    would end the line there and start one of the sender's choosing (RFC 9110 §5.5)."""
    return "\n" in text or "\r" in text


def status_line(status: int, reason: str | None = None) -> str:
    """An answer's first line; always HTTP/1.1 (RFC 9110 §6.2: a server sends its own version)."""
    return f"HTTP/1.1 {status} {reason or REASONS.get(status, 'Unknown')}"


def encode_head(lines: list[str]) -> bytes:
    """A head's bytes: its start line and field lines, each ended by CRLF, then the blank line;
    UnsendableHeadError if any of them holds a line break."""
    if holds_line_break("".join(lines)):  # the head less its separators: no CR or LF left in it
        raise UnsendableHeadError("a line of the head holds a line break")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def raw_answer(fault: EdgeFault, message: str | None = None, retry_after_s: float = 1.0) -> bytes:
    """A complete HTTP/1.1 answer for ``fault``: OpenAI-shaped JSON, then the connection closes.

    ``message`` (our own words, never the client's bytes) says more than the fault's own; a 503
    says to retry after ``retry_after_s`` (whole seconds, rounded up)."""
    refusal = EDGE_FAULTS[fault]
    body = json.dumps(refusal_body(refusal, message)).encode()
    lines = [
        status_line(refusal.status),
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if refusal.status == 503:
        lines.append(f"Retry-After: {max(1, math.ceil(retry_after_s))}")
    return encode_head(lines) + body


def charset_of(content_type: str | None) -> str | None:
    """The ``charset`` parameter of a Content-Type field's value, if it names one."""
    if content_type is None or ";" not in content_type:
        return None
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"') or None
    return None
