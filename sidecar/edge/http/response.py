"""The proxy port's answers: a whole :class:`Response`, or a :class:`StreamResponse` written as it
goes, each framed on the wire per RFC 9112 §6 for the request it answers.

A streamed body is chunked for HTTP/1.1, delimited by the connection's close for HTTP/1.0, and
sent as it is where the engine gave a Content-Length. HEAD, 1xx, 204 and 304 answers carry no
body. The head itself is written by :func:`sidecar.edge.message.encode_head`. What is left of an
answer once its handler returned is :func:`rest_of_answer`'s, a 500 where there is none to send.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from email.utils import formatdate

from multidict import CIMultiDict

from sidecar.core.outcomes import error_body
from sidecar.edge.http.request import Request
from sidecar.edge.message import (
    NO_BODY_STATUSES,
    REASONS,
    UnsendableHeadError,
    encode_head,
    status_line,
)

# Set by the framing below, whatever a handler or the engine put in the fields.
FRAMING_FIELDS = frozenset({"transfer-encoding", "connection", "keep-alive"})
SIZED_FIELDS = FRAMING_FIELDS | {"content-length"}  # a whole answer's length is its body's
LAST_CHUNK = b"0\r\n\r\n"


class _Date:
    """The Date field's value, formatted once a second."""

    __slots__ = ("second", "value")

    def __init__(self) -> None:
        self.second = -1
        self.value = ""


_DATE = _Date()


def http_date() -> str:
    now, date = int(time.time()), _DATE
    if now != date.second:
        date.second, date.value = now, formatdate(now, usegmt=True)
    return date.value


def has_body(request: Request, status: int) -> bool:
    return request.method != "HEAD" and status >= 200 and status not in NO_BODY_STATUSES


def response_head(
    status: int,
    reason: str,
    fields: CIMultiDict[str],
    extra: list[str],
    *,
    close: bool,
    skip: frozenset[str] = FRAMING_FIELDS,
) -> bytes:
    """The status line and fields (those in ``skip``, which frame the body, left to ``extra``),
    then the blank line; UnsendableHeadError if any of them holds a line break."""
    lines = [status_line(status, reason)]
    for k, v in fields.items():  # istr keys; a loop, as in http1.encode_request
        if k.lower() not in skip:
            lines.append(k + ": " + v)
    lines += extra
    if "Date" not in fields:
        lines.append("Date: " + http_date())
    if close:
        lines.append("Connection: close")
    return encode_head(lines)


class Response:
    """A whole answer: status, fields and body, sent in one write once the handler returns it."""

    __slots__ = ("body", "headers", "reason", "status")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        content_type: str | None = None,
    ) -> None:
        self.status, self.body = status, body
        self.reason = REASONS.get(status, "Unknown")
        self.headers: CIMultiDict[str] = CIMultiDict(headers or {})
        if content_type is not None:
            self.headers["Content-Type"] = content_type

    def encode(self, request: Request, *, close: bool) -> bytes:
        """The answer's bytes for ``request``."""
        body = has_body(request, self.status)
        extra = [f"Content-Length: {len(self.body)}"] if body or request.method == "HEAD" else []
        if not close and request.version < (1, 1):
            extra.append("Connection: keep-alive")  # an HTTP/1.0 client that asked for it
        head = response_head(
            self.status, self.reason, self.headers, extra, close=close, skip=SIZED_FIELDS
        )
        return head + self.body if body else head


class StreamResponse:
    """An answer whose body is written as it arrives: ``prepare``, ``write`` ..., ``write_eof``.

    With ``head_with_body``, the status line and fields wait for the first body bytes and leave
    with them, in one write (for an engine head that came with body bytes in the same read).
    """

    __slots__ = (
        "_body",
        "_chunked",
        "_pending",
        "_request",
        "closes",
        "finished",
        "head_with_body",
        "headers",
        "reason",
        "status",
    )

    def __init__(
        self, status: int = 200, reason: str | None = None, *, head_with_body: bool = False
    ) -> None:
        self.status = status
        self.reason = reason or REASONS.get(status, "Unknown")
        self.headers: CIMultiDict[str] = CIMultiDict()
        self.head_with_body = head_with_body
        self.finished = False  # the body's end went out
        self.closes = False  # the head said Connection: close, or the body ends with the connection
        self._request: Request | None = None
        self._pending = b""  # the head, while it waits for the first body bytes
        self._chunked = self._body = False

    @property
    def prepared(self) -> bool:
        return self._request is not None

    async def prepare(self, request: Request) -> None:
        """Frame the answer for ``request`` and send its head (or hold it, ``head_with_body``)."""
        if self._request is not None:
            return
        self._request = request
        request.started = True
        self._body = has_body(request, self.status)
        close = not request.wire.keeps(request)
        extra: list[str] = []
        if self._body and "Content-Length" not in self.headers:
            if request.version >= (1, 1):
                self._chunked = True
                extra.append("Transfer-Encoding: chunked")
            else:
                close = True  # HTTP/1.0: the body ends where the connection does
        elif not close and request.version < (1, 1):
            extra.append("Connection: keep-alive")  # an HTTP/1.0 client that asked for it
        self.closes = close
        head = response_head(self.status, self.reason, self.headers, extra, close=close)
        if self.head_with_body and self._body:
            self._pending = head
            return
        await self._send(head)

    async def write(self, data: bytes) -> None:
        """One piece of the body; ConnectionResetError once the client is gone."""
        if data and self._body:
            await self._send(self._framed(data))

    def write_now(self, data: bytes) -> None:
        """``write`` for a caller that knows the client is there and that its socket's buffer
        has room: nothing to wait for, so no coroutine."""
        if data and self._body:
            assert self._request is not None, "prepare() first"
            self._request.transport.write(self._framed(data))

    def _framed(self, data: bytes) -> bytes:
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data
        if self._pending:
            framed, self._pending = self._pending + framed, b""
        return framed

    async def write_eof(self, last: bytes = b"") -> None:
        """The body's ``last`` bytes and its end, in one write."""
        if self.finished:
            return
        if not self._body:
            out = self._pending
        elif self._chunked:
            out = self._pending + (b"%x\r\n%b\r\n" % (len(last), last) if last else b"")
            out += LAST_CHUNK
        else:
            out = self._pending + last
        self._pending = b""
        if out:
            await self._send(out)
        self.finished = True

    async def _send(self, data: bytes) -> None:
        request = self._request
        assert request is not None, "prepare() first"
        wire = request.wire
        if wire.lost or request.transport.is_closing():
            raise ConnectionResetError("the client's connection is closed")
        request.transport.write(data)
        if wire.paused:
            await wire.drain()


# What a handler returns.
Answer = Response | StreamResponse


def internal_error() -> Response:
    """The 500 of a handler that failed, of an answer that cannot be sent, and of any error the
    sidecar does not know (:func:`sidecar.edge.openai_errors.error_response`): OpenAI-shaped."""
    body = error_body("internal sidecar error", type_="server_error", code="internal_error")
    return Response(500, json.dumps(body).encode(), content_type="application/json")


INTERNAL_ERROR = internal_error()


def rest_of_answer(
    request: Request, response: Answer | None, keeps: Callable[[Request], bool]
) -> tuple[bytes, bool | None]:
    """What is left to write of ``request``'s answer once its handler returned (``None``: it
    failed), and whether the connection is kept (None: the answer must be cut off). An answer
    that cannot be sent, or none at all, is a 500 in its place, where nothing of it went out."""
    if isinstance(response, StreamResponse) and response.prepared:
        return b"", response.finished and not response.closes and keeps(request)
    if isinstance(response, Response):
        keep = keeps(request)
        try:
            return response.encode(request, close=not keep), keep
        except UnsendableHeadError:
            return INTERNAL_ERROR.encode(request, close=True), False
    if request.started:
        return b"", None
    return INTERNAL_ERROR.encode(request, close=True), False
