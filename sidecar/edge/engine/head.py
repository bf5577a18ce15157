"""An engine answer's head, made from what llhttp parsed.

llhttp checks the syntax strictly: the status line, field names, field values (no NUL, bare CR
or LF, or other control character), a single Content-Length, chunk framing. What it leaves to
its user is checked here: the reason phrase (llhttp passes any byte in it), a status code outside
100-599 (llhttp reads any three digits), and any transfer coding but a lone ``chunked`` (the
sidecar decodes no other, and refuses the same on the request side): each would reach the client
as an answer it cannot read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.edge.conformance import chunked_alone
from sidecar.edge.engine.errors import EngineProtocolError
from sidecar.edge.engine.http1 import end_to_end_fields
from sidecar.edge.message import NO_BODY_STATUSES

# Past this the answer is refused, not buffered: it bounds what one engine head can cost.
MAX_HEAD_BYTES = 64 * 1024
MIN_STATUS, MAX_STATUS = 100, 599
# RFC 9112 §4: a reason phrase is HTAB, SP, visible ASCII and obs-text; no other control byte.
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseHead:
    """Status, reason and fields of the engine's answer; ``fields`` is read-only."""

    status: int
    reason: str
    fields: CIMultiDictProxy[str]
    forwarded: tuple[tuple[str, str], ...]  # the end-to-end fields: what a proxy passes on


def final_head(
    status: int, reason: bytes, fields: list[tuple[bytes, bytes]]
) -> ResponseHead | None:
    """The answer's head, or None for an interim (1xx) one, which the real one follows;
    EngineProtocolError for a switch of protocols or a head past ``MAX_HEAD_BYTES``."""
    if 100 <= status < 200:
        if status == 101:
            raise EngineProtocolError("the engine switched protocols")
        return None
    if sum(len(name) + len(value) for name, value in fields) > MAX_HEAD_BYTES:
        raise EngineProtocolError("the engine's response head is too large")
    return make_head(status, reason, fields)


def make_head(status: int, reason: bytes, fields: list[tuple[bytes, bytes]]) -> ResponseHead:
    """The head llhttp parsed, its values decoded as aiohttp's parser does (UTF-8, any other
    byte kept as it came, so it goes out to the client unchanged)."""
    if _CONTROL.search(reason):
        raise EngineProtocolError("the engine's status line holds a control character")
    if not MIN_STATUS <= status <= MAX_STATUS:  # RFC 9110 §15: 100-599; the code is not echoed
        raise EngineProtocolError("the engine's status code is outside 100-599")
    decoded = [
        (name.decode("latin-1"), value.strip(b" \t").decode("utf-8", "surrogateescape"))
        for name, value in fields
    ]
    multi = CIMultiDict(decoded)
    _check_transfer_coding(multi.getall("Transfer-Encoding", []))
    forwarded = end_to_end_fields(decoded, multi.get("Connection"))
    return ResponseHead(
        status=status,
        reason=reason.decode("utf-8", "replace"),
        fields=CIMultiDictProxy(multi),
        forwarded=tuple(forwarded),
    )


def _check_transfer_coding(fields: list[str]) -> None:
    """A Transfer-Encoding, where given, is ``chunked`` alone (RFC 9112 §6.1): the relay would
    pass on a body in a coding it dropped the label of (``gzip, chunked``)."""
    if fields and not chunked_alone(fields):
        raise EngineProtocolError("the engine's answer uses a transfer coding other than chunked")


def ends_at_close(head: ResponseHead, *, head_request: bool) -> bool:
    """Whether the body, if it has one, ends where the engine closes the connection (RFC 9112
    §6.3: neither chunked, the only transfer coding make_head lets through, nor a length)."""
    if head_request or head.status < 200 or head.status in NO_BODY_STATUSES:
        return False
    return "Transfer-Encoding" not in head.fields and "Content-Length" not in head.fields
