"""What HTTP/1.1 says of any message, for both sides of the edge: which answers carry no body,
and which field values cannot be written at all."""

from __future__ import annotations

# RFC 9110 §15.3.5 and §15.4.5 (1xx answers, also bodiless, are told apart by their class).
NO_BODY_STATUSES = frozenset({204, 304})


def holds_line_break(text: str) -> bool:
    """Whether ``text`` (a line of a head, less its separators) holds a CR or LF: written out, it
    would end the line there and start one of the sender's choosing (RFC 9110 §5.5)."""
    return "\n" in text or "\r" in text
