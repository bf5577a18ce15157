"""HTTP/1.1 on the wire, as the engine client needs it: pure functions over bytes, no I/O.

Framing follows RFC 9112 §6.3: no body for HEAD, 1xx, 204 and 304; ``Transfer-Encoding: chunked``
over ``Content-Length`` (the connection is then not reused); a body with neither ends when the
engine closes. Anything else malformed is an :class:`EngineProtocolError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

from multidict import CIMultiDict, CIMultiDictProxy, MultiMapping

# Past these the answer is refused, not buffered: they bound what one engine answer can cost.
MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_LINE = 4 * 1024
MAX_SIZE_DIGITS = 16  # a chunk size of 16 hex digits is already 16 EiB

NO_BODY_STATUSES = frozenset({204, 304})
# Sent by the sidecar itself, whatever the client sent: the framing of the request it writes.
# Expect too: the body goes out with the head, so there is nothing for a 100 Continue to unblock.
OWN_FIELDS = frozenset({"host", "content-length", "transfer-encoding", "connection", "expect"})
HEX_DIGITS = b"0123456789abcdefABCDEF"
SP, HTAB = 32, 9  # b" " and b"\t" as the ints ``in`` tests bytes for
# RFC 9110 §7.6.1 hop-by-hop fields, plus the framing fields each side writes anew (the proxy port's
# server toward the client, http1.encode_request toward the engine).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)

# Heads kept by HeadCache: an engine's streamed answers share a head but for its Date; a few
# seconds' worth, and the odd other head (an error's), before it starts again.
HEAD_CACHE_SIZE = 8

Framing = Literal["none", "length", "chunked", "close"]


class EngineProtocolError(Exception):
    """The engine's answer broke HTTP/1.1 framing (or its connection closed before a head)."""


class UnsendableRequestError(EngineProtocolError):
    """A request line or field that HTTP/1.1 cannot carry (a line break, a NUL)."""


def end_to_end(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """Headers without hop-by-hop fields (and those named in the Connection header)."""
    return CIMultiDict(end_to_end_fields(headers))


def end_to_end_fields(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """``end_to_end`` as name, value pairs, in order."""
    connection = headers.get("Connection")
    drop = HOP_BY_HOP
    if connection:  # most requests name no extra fields: no set built
        drop = HOP_BY_HOP | {token.strip().lower() for token in connection.split(",")}
    # Loops, not comprehensions, here and in the heads: a comprehension is a function made and
    # called each time (Python 3.11), ~1k instructions for a handful of fields, once a request.
    fields = []
    for k, v in headers.items():
        if k.lower() not in drop:
            fields.append((k, v))
    return fields


def encode_request(
    method: str, target: str, host: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    """One request's bytes: request line, Host, the client's end-to-end fields, our framing."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    # ``+``, not an f-string: the keys are multidict's istr, which an f-string formats slowly.
    for k, v in headers.items():  # a loop: see end_to_end_fields
        if k.lower() not in OWN_FIELDS:
            lines.append(k + ": " + v)
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    fields = "".join(lines)  # the head less its separators: no CR, LF or NUL may be left in it
    if "\n" in fields or "\r" in fields:
        msg = "a request line or header field holds a line break"
        raise UnsendableRequestError(msg)
    if "\x00" in fields or " " in target:
        msg = "a request line or header field holds a forbidden character"
        raise UnsendableRequestError(msg)
    encoded = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
    return encoded + body if body else encoded


def parse_head(head: bytes) -> tuple[int, str, CIMultiDict[str], bool]:
    """Status, reason, fields and whether it is HTTP/1.0, from a head without its blank line."""
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise EngineProtocolError(f"the engine's status line is not HTTP/1.x: {lines[0][:80]!r}")
    fields: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        # Ints, not b" " and b"\t": ``in`` takes an int at once (one memchr), tries a bytes
        # operand as an int first (a TypeError made and cleared), and ``find`` parses its
        # arguments from a tuple (~800 instructions under callgrind): two per field, per answer.
        if not colon or not name or SP in name or HTAB in name:
            raise EngineProtocolError(f"the engine sent a malformed header line: {line[:80]!r}")
        # As aiohttp's parser does: UTF-8, with any other byte kept as it came.
        fields.add(
            name.decode("utf-8", "surrogateescape"),
            value.strip(b" \t").decode("utf-8", "surrogateescape"),
        )
    return int(code), reason.decode("utf-8", "replace"), fields, version == b"HTTP/1.0"


class Head(NamedTuple):
    """An answer's head, parsed. ``fields`` is read-only: HeadCache hands one head to many."""

    status: int
    reason: str
    fields: CIMultiDictProxy[str]
    http10: bool
    framing: tuple[Framing, int, bool]  # framing() of it, for any request but HEAD
    forwarded: tuple[tuple[str, str], ...]  # its end-to-end fields: what a proxy passes on


class HeadCache:
    """``parse_head``, ``framing`` and ``end_to_end`` of the heads seen last, by their bytes.

    An engine's heads repeat: vLLM's streamed answers differ only in their Date, once a second, so
    all but the first of each second skip the parse (~6 us a request). Answers framed by
    Content-Length vary with their body and are not kept; at most ``size`` heads are, then the
    cache is emptied and fills again. Errors are raised, never kept. Where the engine echoes a
    field of each request (vLLM's ``--enable-request-id-headers``), no head repeats: each is
    parsed as before, for one lookup more.
    """

    __slots__ = ("_heads", "_size")

    def __init__(self, size: int = HEAD_CACHE_SIZE) -> None:
        self._heads: dict[bytes, Head] = {}
        self._size = size

    def __len__(self) -> int:
        return len(self._heads)

    def parse(self, head: bytes) -> Head:
        """``head`` (without its blank line) parsed, as ``parse_head`` and ``framing`` do."""
        parsed = self._heads.get(head)
        if parsed is not None:
            return parsed
        status, reason, fields, http10 = parse_head(head)
        framed = framing(status, fields, http10=http10, head_request=False)
        forwarded = tuple(end_to_end_fields(fields))
        parsed = Head(status, reason, CIMultiDictProxy(fields), http10, framed, forwarded)
        if framed[0] != "length":
            if len(self._heads) >= self._size:
                self._heads.clear()
            self._heads[head] = parsed
        return parsed


def framing(
    status: int, fields: MultiMapping[str], *, http10: bool, head_request: bool
) -> tuple[Framing, int, bool]:
    """How the answer's body is delimited (RFC 9112 §6.3): its framing, its Content-Length (0
    when not framed by length), and whether the connection may carry another request after it."""
    connection = {t.strip().lower() for t in fields.get("Connection", "").split(",")}
    keep_alive = not http10 and "close" not in connection
    if head_request or status in NO_BODY_STATUSES or status < 200:
        return "none", 0, keep_alive
    coding = fields.getall("Transfer-Encoding", [])
    if coding:
        codings = [c.strip().lower() for value in coding for c in value.split(",")]
        if codings[-1] != "chunked":
            return "close", 0, False
        # Both framings (RFC 9112 §6.1): a request-smuggling shape; chunked wins, never reuse.
        return "chunked", 0, keep_alive and "Content-Length" not in fields
    lengths = fields.getall("Content-Length", [])
    if lengths:
        values = {v.strip() for value in lengths for v in value.split(",")}
        length = next(iter(values))
        if len(values) != 1 or not (length.isascii() and length.isdigit()):
            raise EngineProtocolError(f"the engine sent Content-Length {lengths!r}")
        return "length", int(length), keep_alive
    return "close", 0, False


def chunk_size(line: bytes) -> int:
    """The size on a chunk-size line, in bytes."""
    digits = line.split(b";", 1)[0].rstrip(b" \t")  # a chunk extension is ignored
    if not digits or len(digits) > MAX_SIZE_DIGITS or digits.strip(HEX_DIGITS):
        raise EngineProtocolError(f"the engine sent a bad chunk size: {line[:40]!r}")
    return int(digits, 16)
