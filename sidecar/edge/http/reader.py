"""A client connection's bytes into requests: llhttp's callbacks (httptools), each head into a
:class:`~sidecar.edge.http.request.Request` handed to the connection, each body fed to its
request as it arrives."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import httptools

from sidecar.edge.http.head import Head
from sidecar.edge.http.port import Port
from sidecar.edge.http.request import Request, Wire


class Receiver(Wire, Protocol):
    """The connection, as its reader sees it."""

    transport: asyncio.Transport
    client: str

    def head_begun(self) -> None:
        """The first bytes of a request's head arrived."""

    def received(self, request: Request) -> None:
        """A request's head is complete: ``request`` is to be handled, or queued."""


class RequestReader:
    """One connection's parser, and the head and body it is receiving."""

    __slots__ = ("_connection", "_parser", "_port", "body_of", "head")

    def __init__(self, connection: Receiver, port: Port[Any]) -> None:
        self._connection, self._port = connection, port
        self._parser = httptools.HttpRequestParser(self)
        self.head: Head | None = None  # a head being received
        self.body_of: Request | None = None  # the request whose body is being received

    def feed(self, data: bytes) -> None:
        """Parse ``data``; raises what llhttp raises (httptools' errors)."""
        self._parser.feed_data(data)

    @property
    def head_too_large(self) -> bool:
        """The head being received is past the port's bound and still not complete."""
        return self.head is not None and self.head.size > self._port.max_head_bytes

    # llhttp's callbacks.

    def on_message_begin(self) -> None:
        self.head = Head(self._port.limits)
        self._connection.head_begun()

    def on_url(self, url: bytes) -> None:
        self._receiving_head().add_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._receiving_head().add_field(name, value)

    def on_headers_complete(self) -> None:
        head, port, connection = self._receiving_head(), self._port, self._connection
        request = head.request(
            self._parser, connection.transport, connection, port.max_body_bytes,
            budget=port.bodies, client=connection.client,
        )  # fmt: skip
        self.head = None
        self.body_of = request if request.body_exists else None
        connection.received(request)

    def on_body(self, body: bytes) -> None:
        if self.body_of is not None:
            self.body_of.feed(body)

    def on_message_complete(self) -> None:
        if self.body_of is not None:
            self.body_of.end_of_body()
            self.body_of = None

    def _receiving_head(self) -> Head:
        assert self.head is not None, "llhttp calls on_message_begin first"
        return self.head
