"""A floor for any Python relay: bytes pumped between a client and the engine, and nothing else.

One engine connection per client connection; whatever either side sends is written to the other
from the protocol callback that read it: no HTTP parsed, no task woken, no admission, no log.
``relay_bench`` runs it as the ``pump`` target (``BENCH_RELAY_TARGETS=...,pump``), on the event
loop the sidecar runs on (``SIDECAR_EVENT_LOOP``, read the same way: auto is uvloop where
installed), so that what a run shows between ``pump`` and ``nginx`` is what the loop and the
interpreter cost before the sidecar does any work of its own.

``--parse`` is the floor of a proxy that must read each request before it lets it through, as
any admission does: the request is parsed with llhttp (httptools, as the sidecar's server side
does), its JSON body decoded and its ``max_tokens`` read, and only then are its bytes sent on as
they came. The answer is still pumped unread. ``relay_bench`` and ``instructions_bench`` run it
as the ``parse`` target.

Run: ``python -m benchmarks.byte_pump --port 8081 --upstream-port 8000 [--parse]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from collections.abc import Sequence
from typing import cast

import httptools

from benchmarks.loops import run_as_serve


class _Side(asyncio.Protocol):
    """One socket of a pair; what it reads goes to its peer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self._early: list[bytes] = []  # read before the peer was connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self._early.append(data)
        else:
            peer.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    def pair(self, peer: _Side) -> None:
        self.peer = peer
        assert peer.transport is not None
        for data in self._early:
            peer.transport.write(data)
        self._early = []


class _Client(_Side):
    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self._upstream_port = upstream_port

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, engine = await loop.create_connection(_Side, "127.0.0.1", self._upstream_port)
        except OSError:
            assert self.transport is not None
            self.transport.abort()
            return
        engine.pair(self)
        self.pair(engine)


class _ParsingClient(_Client):
    """A client side that holds each request until it is whole and its JSON body read; its
    target and fields are kept, as any proxy keeps them to route and check it."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self._parser = httptools.HttpRequestParser(self)
        self._raw: list[bytes] = []
        self._body: list[bytes] = []
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self.max_tokens: object = None

    def data_received(self, data: bytes) -> None:
        self._raw.append(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.abort()

    # httptools' callbacks
    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._body:
            self.max_tokens = json.loads(b"".join(self._body)).get("max_tokens")
        raw = b"".join(self._raw)
        self._raw, self._body, self._headers, self._url = [], [], [], b""
        super().data_received(raw)  # with any pipelined request's bytes read so far


async def serve(port: int, upstream_port: int, parse: bool = False) -> None:
    loop = asyncio.get_running_loop()
    client = _ParsingClient if parse else _Client
    server = await loop.create_server(lambda: client(upstream_port), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument(
        "--parse", action="store_true", help="read each request (head, JSON) before passing it on"
    )
    args = parser.parse_args(argv)
    run_as_serve(serve(args.port, args.upstream_port, args.parse))


if __name__ == "__main__":
    main()
