"""The request reader parses at most one request ahead of the one running, whatever the bytes
hold: the rest waits unparsed in its backlog, fed on when the connection asks (no sockets)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from sidecar.edge.http.connections import ConnectionTable
from sidecar.edge.http.limits import BodyBudget, EdgeLimits
from sidecar.edge.http.port import Port
from sidecar.edge.http.reader import RequestReader
from sidecar.edge.http.request import Request


class Receiver:
    """A connection as the reader sees it: one request runs, one may wait behind it."""

    transport = cast(asyncio.Transport, object())
    client = "127.0.0.1"
    paused = lost = False

    def __init__(self) -> None:
        self.running_one: Request | None = None
        self.waiting: list[Request] = []
        self.heads_begun = 0

    async def drain(self) -> None: ...

    def rested_s(self) -> float:
        return 0.0

    def keeps(self, request: Request) -> bool:
        return True

    def head_begun(self) -> None:
        self.heads_begun += 1

    def received(self, request: Request) -> None:
        if self.running_one is None:
            self.running_one = request
        else:
            self.waiting.append(request)

    def running(self) -> bool:
        return self.running_one is not None

    def takes_more(self) -> bool:
        return not self.waiting

    def next(self) -> None:
        """The running request answered: the waiting one runs."""
        self.running_one = self.waiting.pop(0) if self.waiting else None


def reader() -> tuple[RequestReader, Receiver]:
    port: Port[Any] = Port(
        handler=lambda _r: None,  # type: ignore[arg-type,return-value]
        limits=EdgeLimits(),
        max_body_bytes=1 << 20,
        connections=ConnectionTable(8, 8, 8, clock=lambda: 0.0),
        bodies=BodyBudget(1 << 24),
    )
    receiver = Receiver()
    return RequestReader(receiver, port), receiver


GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
POST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n\r\n\r\n"
CHUNKED = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"4\r\n\r\n\r\n\r\n0\r\n\r\n"
)


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(GET, id="get"),
        pytest.param(POST, id="body-of-blank-lines"),
        pytest.param(CHUNKED, id="chunked-body-of-blank-lines"),
    ],
)
def test_one_read_of_a_thousand_requests_parses_two(first: bytes) -> None:
    """A read holding 1,000 pipelined requests: the first runs, the second waits, the rest stay
    unparsed, byte for byte; each answer lets exactly one more be parsed, in order."""
    parse, connection = reader()
    rest = GET * 998
    parse.take(first + GET + rest)
    assert connection.running_one is not None
    assert len(connection.waiting) == 1
    assert bytes(parse.backlog) == rest
    for left in range(998, 0, -1):
        connection.next()
        parse.resume()
        assert len(connection.waiting) == 1
        assert len(parse.backlog) == len(GET) * (left - 1)
    connection.next()
    parse.resume()
    assert (connection.running_one is not None, connection.waiting) == (True, [])


def test_what_arrives_behind_a_waiting_request_is_kept_unparsed() -> None:
    """Reads that come while a request waits are added to the backlog as they are."""
    parse, connection = reader()
    parse.take(GET + GET)
    parse.take(b"GET /a HTTP/1.1\r\n")
    parse.take(b"Host: x\r\n\r\n")
    assert bytes(parse.backlog) == b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
    connection.next()
    parse.resume()
    assert connection.waiting[0].raw_path == "/a"


def test_a_lone_request_is_fed_whole() -> None:
    """The common case, one request in one read: parsed at once, nothing kept."""
    parse, connection = reader()
    parse.take(POST)
    assert connection.running_one is not None
    assert connection.running_one.complete
    assert parse.backlog == bytearray()
