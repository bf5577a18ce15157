"""An engine answer's head, made from what llhttp parsed.

llhttp checks the syntax strictly: the status line, field names, field values (no NUL, bare CR
or LF, or other control character), a single Content-Length, chunk framing. What it leaves to
its user is checked here: the reason phrase (llhttp passes any byte in it) and the head's size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.edge.engine.errors import EngineProtocolError
from sidecar.edge.engine.http1 import end_to_end_fields

# Past this the answer is refused, not buffered: it bounds what one engine head can cost.
MAX_HEAD_BYTES = 64 * 1024
NO_BODY_STATUSES = frozenset({204, 304})
# RFC 9112 §4: a reason phrase is HTAB, SP, visible ASCII and obs-text; no other control byte.
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Head:
    """Status, reason and fields of the engine's answer; ``fields`` is read-only."""

    status: int
    reason: str
    fields: CIMultiDictProxy[str]
    forwarded: tuple[tuple[str, str], ...]  # the end-to-end fields: what a proxy passes on


def make_head(status: int, reason: bytes, fields: list[tuple[bytes, bytes]]) -> Head:
    """The head llhttp parsed, its values decoded as aiohttp's parser does (UTF-8, any other
    byte kept as it came, so it goes out to the client unchanged)."""
    if _CONTROL.search(reason):
        raise EngineProtocolError("the engine's status line holds a control character")
    decoded = [
        (name.decode("latin-1"), value.strip(b" \t").decode("utf-8", "surrogateescape"))
        for name, value in fields
    ]
    multi = CIMultiDict(decoded)
    forwarded = end_to_end_fields(decoded, multi.get("Connection"))
    return Head(
        status, reason.decode("utf-8", "replace"), CIMultiDictProxy(multi), tuple(forwarded)
    )


def ends_at_close(head: Head, *, head_request: bool) -> bool:
    """Whether the body, if it has one, ends where the engine closes the connection (RFC 9112
    §6.3: neither chunked as the final coding nor a Content-Length)."""
    if head_request or head.status < 200 or head.status in NO_BODY_STATUSES:
        return False
    codings = head.fields.getall("Transfer-Encoding", [])
    if codings:
        return codings[-1].rsplit(",", 1)[-1].strip().lower() != "chunked"
    return "Content-Length" not in head.fields
