"""A client connection's bytes into requests: llhttp's callbacks (httptools), each head into a
:class:`~sidecar.edge.http.request.Request` handed to the connection, each body fed to its
request as it arrives.

At most one request is parsed ahead of the one running (h11 and uvicorn read one ahead too): once
a pipelined request waits, what follows it stays unparsed in ``backlog`` (one read: the connection
stops reading) until the connection takes the next. llhttp cannot stop inside what it is fed, so
bytes that may hold more than one head are fed a line at a time (a head ends only at a line's
end), a body by its length, a chunked one a blank line at a time.

A chunked body pays a callback and a charge to the body budget per chunk, so chunks smaller than
any client needs are refused: past ``FREE_CHUNKS`` chunks, a body whose chunks so far average
under ``MIN_CHUNK_BYTES`` ends (a 400), and nothing more of its connection is parsed.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import httptools

from sidecar.edge.conformance import HeadRefusedError
from sidecar.edge.http.head import Head
from sidecar.edge.http.port import Port
from sidecar.edge.http.read_floor import ReadFloor
from sidecar.edge.http.request import Request, Wire

# Chunks of any size a body may have before their average counts: small chunked bodies pass as
# they are, and a stream whose first chunks are small (a line of JSON at a time) has room.
FREE_CHUNKS = 64
# The least average chunk a longer chunked body keeps: a 4 MiB body then costs at most 16,384
# callbacks, where 2-byte chunks cost 2 million (about a second of the loop each, measured).
MIN_CHUNK_BYTES = 256


class ChunksTooSmallError(Exception):
    """A chunked body whose chunks average under MIN_CHUNK_BYTES past FREE_CHUNKS of them."""


class Receiver(Wire, Protocol):
    """The connection, as its reader sees it."""

    transport: asyncio.Transport
    client: str

    def head_begun(self) -> None:
        """The first bytes of a request's head arrived."""

    def received(self, request: Request) -> None:
        """A request's head is complete: ``request`` is to be handled, or queued."""

    def running(self) -> bool:
        """A request is being handled: a head that completes now waits behind it."""

    def takes_more(self) -> bool:
        """Whether another request may be parsed now: the connection reads, and no request
        waits behind the one running."""


class RequestReader:
    """One connection's parser, the head and body it is receiving, and the bytes read ahead."""

    __slots__ = (
        "_body_left",
        "_chunks",
        "_connection",
        "_floor",
        "_parser",
        "_port",
        "backlog",
        "body_of",
        "head",
    )

    def __init__(self, connection: Receiver, port: Port[Any]) -> None:
        self._connection, self._port = connection, port
        self._parser = httptools.HttpRequestParser(self)
        self.head: Head | None = None  # a head being received
        self.body_of: Request | None = None  # the request whose body is being received
        self._body_left: int | None = None  # of body_of's, where its Content-Length says
        self._chunks = 0  # of body_of's, where it is chunked
        self.backlog = bytearray()  # read, not parsed: behind a request that waits
        self._floor = ReadFloor()  # the reads of the request being received

    def short_read(self, size: int) -> bool:
        """Count a read of ``size`` bytes: whether the request being received (a head, or a body:
        none in between) has come in reads under the read floor so far."""
        short = self._floor.short(size)
        return short and (self.head is not None or self.body_of is not None)

    def take(self, data: bytes) -> None:
        """Parse ``data`` up to the request after the one running, keeping the rest in
        ``backlog``; raises what llhttp raises (httptools' errors), or HeadRefusedError."""
        if self.backlog or not self._connection.takes_more():
            self.backlog += data
        elif self._within_body(data):
            self._parser.feed_data(data)  # body bytes, none past its length: no head in them
        elif not self._connection.running() and data.count(b"\r\n\r\n") < 2:
            self._feed(data)  # at most one head ends in it: the common case, fed at once
        else:
            self.backlog += data
            self.resume()

    def _within_body(self, data: bytes) -> bool:
        """``data`` is all bytes of the body being received, by its Content-Length."""
        left = self._body_left
        return self.body_of is not None and left is not None and len(data) <= left

    def resume(self) -> None:
        """Parse the backlog in slices, as far as the connection takes more."""
        backlog, at = self.backlog, 0
        try:
            with memoryview(backlog) as view:
                while at < len(backlog) and self._connection.takes_more():
                    end = self._slice_end(backlog, at)
                    with view[at:end] as piece:
                        self._feed(piece)
                    at = end
        finally:
            del backlog[:at]  # from the front: bytearray moves its start, it copies nothing

    def _slice_end(self, data: bytearray, at: int) -> int:
        """Where the next slice ends, so that no slice completes two heads: a body by its length;
        a chunked one (which ends at a blank line, as a head does) up to its first blank line,
        or whole where the rest holds at most one; else at the end of a line."""
        if self.body_of is not None and self._body_left is not None:
            return min(len(data), at + self._body_left)
        if self.body_of is not None:
            first = data.find(b"\r\n\r\n", at)
            if first < 0 or data.find(b"\r\n\r\n", first + 1) < 0:
                return len(data)
            return first + 4
        line_end = data.find(b"\n", at)
        return len(data) if line_end < 0 else line_end + 1

    def _feed(self, data: bytes | memoryview) -> None:
        self._parser.feed_data(data)
        if self.head is not None:
            self.head.size += len(data)
            if self.head_too_large:
                raise HeadRefusedError("the request head is too large")

    @property
    def head_too_large(self) -> bool:
        """The head being received is past the port's bound and still not complete."""
        return self.head is not None and self.head.size > self._port.max_head_bytes

    # llhttp's callbacks.

    def on_message_begin(self) -> None:
        self._floor.begin()
        self.head = Head(limits=self._port.limits)
        self._connection.head_begun()

    def on_url(self, url: bytes) -> None:
        self._receiving_head().add_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._receiving_head().add_field(name, value)

    def on_headers_complete(self) -> None:
        head, port, connection = self._receiving_head(), self._port, self._connection
        request = head.request(
            self._parser,
            connection.transport,
            connection,
            port.max_body_bytes,
            budget=port.bodies,
            client=connection.client,
        )
        self.head = None
        self.body_of = request if request.body_exists else None
        length = request.headers.get("Content-Length")
        self._body_left = int(length) if length is not None and length.isdigit() else None
        self._chunks = 0
        connection.received(request)

    def on_body(self, body: bytes) -> None:
        if self._body_left is not None:
            self._body_left -= len(body)
        if self.body_of is not None:
            self.body_of.feed(body)

    def on_chunk_header(self) -> None:
        """A chunk begins (the last, empty one too): the chunks before it must average
        MIN_CHUNK_BYTES past FREE_CHUNKS of them, one short one aside (a body's last piece)."""
        before, body = self._chunks, self.body_of
        self._chunks += 1
        floor = (before - 1) * MIN_CHUNK_BYTES
        if before > FREE_CHUNKS and body is not None and body.received < floor:
            raise ChunksTooSmallError

    def on_message_complete(self) -> None:
        if self.body_of is not None:
            self.body_of.end_of_body()
            self.body_of = None

    def _receiving_head(self) -> Head:
        assert self.head is not None, "llhttp calls on_message_begin first"
        return self.head
