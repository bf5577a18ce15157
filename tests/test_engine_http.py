"""The engine client's HTTP/1.1, against a scripted engine on a real loopback socket.

Each test's engine answers with exact bytes, so framing, reuse and every way an answer can
break are shown as a user of the sidecar would meet them: a 502 or 504 (UpstreamError), never a
truncated body that looks whole, and a connection reused only when that is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.errors import UpstreamTimeoutError, UpstreamUnavailableError
from sidecar.edge.engine.client import read_all, read_chunk, release, send
from sidecar.edge.engine.connection import HIGH_WATER, EngineConnection
from sidecar.edge.engine.errors import EngineProtocolError
from sidecar.edge.engine.pool import MAX_IDLE_S, EnginePool, EngineResponse
from sidecar.edge.engine.states import Phase
from tests.fake_time import FakeTime

# One scripted answer: given the request's bytes (head and body), the bytes to send back, and
# whether to close the connection after sending them.
Answer = Callable[[bytes], tuple[bytes, bool]]

OK_BODY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def answer(data: bytes, *, close: bool = False) -> Answer:
    return lambda _request: (data, close)


RESET = b"<reset>"  # an answer that ends in a TCP reset (SO_LINGER 0), not a clean close


@dataclass
class Engine:
    """A loopback engine that plays ``answers`` in order, one per request, on any connection."""

    answers: list[Answer] = field(default_factory=list)
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    byte_by_byte: bool = False  # each byte of an answer its own write, and its own read there
    delays: dict[int, float] = field(default_factory=dict)  # request number -> s before answering
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self._answer(reader, writer)
            await reader.read()  # hold the connection until the client drops it

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            request = head + await reader.readexactly(length)
            self.requests.append(request)
            if not self.answers:
                return  # no answer scripted: hold the connection, say nothing
            if delay := self.delays.get(len(self.requests)):
                await asyncio.sleep(delay)
            data, close = self.answers.pop(0)(request)
            reset = data.endswith(RESET)
            data = data.removesuffix(RESET)
            for piece in (
                [data[i : i + 1] for i in range(len(data))] if self.byte_by_byte else [data]
            ):
                writer.write(piece)
                await writer.drain()
                if self.byte_by_byte:
                    await asyncio.sleep(0)  # a turn of the loop, no time: one byte per read
            if reset:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            if close:
                writer.close()
                return


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    scripted = Engine()
    server = await asyncio.start_server(scripted.serve, "127.0.0.1", 0)
    scripted.port = server.sockets[0].getsockname()[1]
    yield scripted
    for writer in scripted.writers:
        writer.close()
    server.close()


async def _upstream(
    port: int,
    *,
    read_timeout_s: float = 5.0,
    path: str = "",
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[EnginePool]:
    upstream = EnginePool(
        f"http://127.0.0.1:{port}{path}",
        connect_timeout_s=2.0,
        read_timeout_s=read_timeout_s,
        clock=clock,
    )
    try:
        yield upstream
    finally:
        upstream.close()


@pytest.fixture
async def upstream(engine: Engine) -> AsyncIterator[EnginePool]:
    async for made in _upstream(engine.port):
        yield made


async def _get_body(upstream: EnginePool, method: str = "POST") -> tuple[EngineResponse, bytes]:
    response = await send(upstream, method, "/v1/x", {"Content-Type": "application/json"}, b"{}")
    try:
        return response, await read_all(response)
    finally:
        release(response)


async def test_a_kept_alive_connection_is_reused(engine: Engine, upstream: EnginePool) -> None:
    engine.answers = [answer(OK_BODY)] * 3
    for _ in range(3):
        response, body = await _get_body(upstream)
        assert (response.status, body) == (200, b"{}")
    assert engine.connections == 1


async def test_the_request_goes_out_as_the_sidecar_means_it(engine: Engine) -> None:
    """Path prefix kept, Host set, the sidecar's own framing fields replace the client's."""
    engine.answers = [answer(OK_BODY)]
    async for upstream in _upstream(engine.port, path="/engine/"):
        headers = {
            "Authorization": "Bearer k",
            "Host": "client.example",
            "Content-Length": "999",
            "Transfer-Encoding": "chunked",
            "Expect": "100-continue",
        }
        response = await send(upstream, "POST", "/v1/chat/completions?x=1", headers, b'{"a":1}')
        release(response)
    head, _, body = engine.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /engine/v1/chat/completions?x=1 HTTP/1.1"
    assert sorted(lines[1:]) == sorted(
        [b"Host: 127.0.0.1:%d" % engine.port, b"Authorization: Bearer k", b"Content-Length: 7"]
    )
    assert body == b'{"a":1}'


async def test_a_header_with_a_line_break_is_never_sent(
    engine: Engine, upstream: EnginePool
) -> None:
    with pytest.raises(UpstreamUnavailableError):
        await send(upstream, "POST", "/v1/x", {"X-A": "1\r\nX-Injected: 1"}, b"{}")
    assert engine.requests == []


async def test_a_chunked_body_with_extensions_and_trailers(
    engine: Engine, upstream: EnginePool
) -> None:
    engine.answers = [
        answer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
        ),
        answer(OK_BODY),
    ]
    _, body = await _get_body(upstream)
    assert body == b"hello world"
    await _get_body(upstream)
    assert engine.connections == 1  # read to its end: reused


async def test_a_chunked_body_split_at_every_byte(engine: Engine, upstream: EnginePool) -> None:
    """However the socket splits it, the body is the same bytes."""
    engine.byte_by_byte = True
    engine.answers = [
        answer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
    ]
    _, body = await _get_body(upstream)
    assert body == b"abcde"


async def test_a_body_without_length_ends_at_close_and_is_not_reused(
    engine: Engine, upstream: EnginePool
) -> None:
    """RFC 9112 §6.3: neither a length nor chunked: the body is what comes before the engine
    closes (a FIN; a reset is a failure, below). Another transfer coding is refused outright
    (test_engine_head)."""
    engine.answers = [answer(b"HTTP/1.1 200 OK\r\n\r\nall of it", close=True), answer(OK_BODY)]
    _, body = await _get_body(upstream)
    assert body == b"all of it"
    await _get_body(upstream)
    assert engine.connections == 2


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    ],
    ids=["connection-close", "http-1.0"],
)
async def test_answers_that_end_their_connection(
    engine: Engine, upstream: EnginePool, head: bytes
) -> None:
    engine.answers = [answer(head), answer(OK_BODY)]
    _, body = await _get_body(upstream)
    assert body == b"{}"
    await _get_body(upstream)
    assert engine.connections == 2


async def test_an_interim_answer_is_skipped(engine: Engine, upstream: EnginePool) -> None:
    engine.answers = [
        answer(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n" + OK_BODY)
    ]
    response, body = await _get_body(upstream)
    assert (response.status, body) == (200, b"{}")


@pytest.mark.parametrize(
    ("method", "head"),
    [
        ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n"),
        ("POST", b"HTTP/1.1 204 No Content\r\n\r\n"),
        ("GET", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 12\r\n\r\n"),
    ],
    ids=["head", "204", "304"],
)
async def test_answers_without_a_body(
    engine: Engine, upstream: EnginePool, method: str, head: bytes
) -> None:
    engine.answers = [answer(head), answer(OK_BODY)]
    _, body = await _get_body(upstream, method)
    assert body == b""
    _, body = await _get_body(upstream)
    assert (body, engine.connections) == (b"{}", 1)


async def test_a_head_request_has_no_body_where_the_same_head_had_one_before(
    engine: Engine, upstream: EnginePool
) -> None:
    """A HEAD request's answer has no body whatever its fields say, and the next answer on
    the same connection, to the same head, has its own."""
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    engine.answers = [answer(head + b"2\r\n{}\r\n0\r\n\r\n"), answer(head), answer(OK_BODY)]
    bodies = [(await _get_body(upstream, method))[1] for method in ("POST", "HEAD", "POST")]
    assert (bodies, engine.connections) == ([b"{}", b"", b"{}"], 1)


async def test_status_reason_and_fields_reach_the_response(
    engine: Engine, upstream: EnginePool
) -> None:
    engine.answers = [
        answer(
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nSet-Cookie: a=1\r\n"
            b"Set-Cookie: b=2\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
            b"Content-Length: 0\r\n\r\n"
        )
    ]
    response, _ = await _get_body(upstream)
    assert (response.status, response.reason) == (429, "Too Many Requests")
    assert response.headers.getall("Set-Cookie") == ["a=1", "b=2"]
    assert response.headers["retry-after"] == "3"
    assert response.content_type == "text/event-stream"


@pytest.mark.parametrize(
    "data",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: value\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Name: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad\tName: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nName : 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
        # Both framings (RFC 9112 §6.3: "ought to be handled as an error"): a smuggling shape.
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Type: text/event-stream\n\n",
        b"HTTP/1.1 200 OK\r\nX-A: 1\nX-B: 2\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nX-A: 1\rX-B: 2\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nX-A: a\x1bb\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 O\x00K\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
    ],
    ids=[
        "not-http",
        "status-4-digits",
        "http-2",
        "obs-fold",
        "space-in-name",
        "tab-in-name",
        "space-before-colon",
        "two-lengths",
        "signed-length",
        "head-too-large",
        "length-and-chunked",
        "bare-lf-head",
        "bare-lf-in-a-field",
        "bare-cr-in-a-field",
        "nul-in-a-field",
        "escape-in-a-field",
        "nul-in-the-reason",
        "switching-protocols",
    ],
)
async def test_a_broken_head_is_a_502(engine: Engine, upstream: EnginePool, data: bytes) -> None:
    engine.answers = [answer(data), answer(OK_BODY)]
    with pytest.raises(UpstreamUnavailableError):
        await send(upstream, "POST", "/v1/x", {}, b"{}")
    await _get_body(upstream)
    assert engine.connections == 2  # the broken connection was not kept


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}extra",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 5000,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\n\n",
    ],
    ids=[
        "not-hex",
        "hex-prefix",
        "underscore",
        "chunk-overrun",
        "past-length",
        "endless-size",
        "bare-lf-size-line",
        "bare-lf-after-data",
        "bare-lf-last-chunk",
    ],
)
async def test_a_broken_body_is_an_error_not_a_short_body(
    engine: Engine, upstream: EnginePool, data: bytes
) -> None:
    engine.answers = [answer(data)]
    # Whether the break comes in the head's read or a later one, it is an error, never a body.
    with pytest.raises(UpstreamUnavailableError):
        await _get_body(upstream)


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n12345\r\n",
    ],
    ids=["length", "chunked"],
)
async def test_an_engine_gone_mid_body_is_an_error(
    engine: Engine, upstream: EnginePool, data: bytes
) -> None:
    engine.answers = [answer(data, close=True)]
    response = await send(upstream, "POST", "/v1/x", {}, b"{}")
    assert await read_chunk(response) == b"12345"
    with pytest.raises(UpstreamUnavailableError) as caught:
        await read_chunk(response)
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    release(response)


async def test_a_reset_ends_no_close_delimited_body(engine: Engine, upstream: EnginePool) -> None:
    """A body framed by the engine's close ends cleanly on a FIN; a reset is a failure."""
    engine.answers = [answer(b"HTTP/1.1 200 OK\r\n\r\npart" + RESET)]
    response = await send(upstream, "POST", "/v1/x", {}, b"{}")
    with pytest.raises(UpstreamUnavailableError):
        await read_all(response)
    release(response)


async def test_an_engine_gone_before_its_head_is_a_502(
    engine: Engine, upstream: EnginePool
) -> None:
    engine.answers = [answer(b"", close=True)]
    with pytest.raises(UpstreamUnavailableError):
        await send(upstream, "POST", "/v1/x", {}, b"{}")


async def test_a_kept_alive_connection_the_engine_closed_is_replaced(
    engine: Engine, upstream: EnginePool
) -> None:
    """The engine's keep-alive timeout closed the idle connection, and the pool saw it: nothing
    was sent on it, so the POST goes out on a new one; the engine saw it once."""
    engine.answers = [answer(OK_BODY), answer(OK_BODY)]
    await _get_body(upstream)
    for writer in engine.writers:
        writer.close()  # the engine ends the idle connection
    engine.writers.clear()
    for _ in range(100):  # loop turns, bounded: the close reaches the pooled connection
        if upstream.idle == 1 and await _pooled_closing(upstream):
            break
        await asyncio.sleep(0)
    response, body = await _get_body(upstream)
    assert (response.status, body, engine.connections, len(engine.requests)) == (200, b"{}", 2, 2)


@pytest.mark.parametrize(
    ("idle_s", "connections"),
    [
        pytest.param(MAX_IDLE_S - 0.1, 1, id="idle-under-the-bound-is-reused"),
        pytest.param(MAX_IDLE_S + 0.1, 2, id="idle-past-the-bound-is-replaced"),
    ],
)
async def test_a_connection_idle_too_long_is_closed_not_reused(
    engine: Engine, idle_s: float, connections: int
) -> None:
    """The engine closes a connection idle for its keep-alive timeout (vLLM's: 5 s), and a POST
    sent on it just then gets no answer (a 502): past MAX_IDLE_S the POST takes a new connection
    and the old one is closed; under it, the kept-alive one is reused."""
    engine.answers = [answer(OK_BODY)] * 2
    fake = FakeTime()
    async for upstream in _upstream(engine.port, clock=fake.clock):
        await _get_body(upstream)
        [(_, first)] = upstream._idle
        fake.advance(idle_s)
        response, body = await _get_body(upstream)
        assert (response.status, body, upstream.idle) == (200, b"{}", 1)
        assert first.closing is (connections == 2)
    assert (engine.connections, len(engine.requests)) == (connections, 2)


async def _pooled_closing(upstream: EnginePool) -> bool:
    await asyncio.sleep(0)
    return all(connection.closing for _, connection in upstream._idle)


async def test_a_post_is_never_sent_twice(engine: Engine, upstream: EnginePool) -> None:
    """RFC 9112 §9.3.1: the engine closed a reused connection just as a POST went out on it,
    without a byte of an answer. The POST may have reached it (and be generating): a 502, and
    the engine saw it once."""
    engine.answers = [answer(OK_BODY), answer(b"", close=True), answer(OK_BODY)]
    await _get_body(upstream)
    with pytest.raises(UpstreamUnavailableError) as caught:
        await _get_body(upstream)
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    assert (engine.connections, len(engine.requests)) == (1, 2)


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"])
async def test_an_idempotent_request_on_a_connection_closed_unanswered_is_sent_once_more(
    engine: Engine, upstream: EnginePool, method: str
) -> None:
    """The same race for an idempotent request: not one byte came back, so it is sent again,
    once, on a new connection."""
    last = OK_BODY.removesuffix(b"{}") if method == "HEAD" else OK_BODY
    engine.answers = [answer(OK_BODY), answer(b"", close=True), answer(last)]
    await _get_body(upstream)
    response = await send(upstream, method, "/v1/x", {}, None)
    body = await read_all(response)
    release(response)
    assert response.status == 200
    assert body == (b"" if method == "HEAD" else b"{}")
    assert (engine.connections, len(engine.requests)) == (2, 3)
    assert engine.requests[1] == engine.requests[2]


async def test_a_new_connection_closed_unanswered_is_not_sent_again(engine: Engine) -> None:
    """Only a kept-alive connection's close may be a race with its reuse: on a new connection
    the engine's close is its answer, a 502, even for a GET."""
    engine.answers = [answer(b"", close=True), answer(OK_BODY)]
    async for upstream in _upstream(engine.port):
        with pytest.raises(UpstreamUnavailableError):
            await send(upstream, "GET", "/v1/models", {}, None)
    assert len(engine.requests) == 1


async def test_sent_comes_once_the_engine_can_read_the_request() -> None:
    """``sent`` (the proxy's grant line) runs after the request is written and before the
    answer: here the engine is the callback itself, reading the request and answering."""
    listener = socket.create_server(("127.0.0.1", 0))
    read: list[bytes] = []
    accepted: list[socket.socket] = []

    def sent() -> None:
        conn, _ = listener.accept()  # connected already: in the backlog
        accepted.append(conn)
        conn.settimeout(2.0)
        data = b""
        while not data.endswith(b'{"a":1}'):  # a request not yet written fails here, in time
            data += conn.recv(65536)
        read.append(data)
        conn.sendall(OK_BODY)

    try:
        async for upstream in _upstream(listener.getsockname()[1]):
            response = await send(upstream, "POST", "/v1/x", {}, b'{"a":1}', sent=sent)
            assert (response.status, await read_all(response)) == (200, b"{}")
    finally:
        for conn in accepted:
            conn.close()
        listener.close()
    assert len(read) == 1
    assert read[0].startswith(b"POST /v1/x HTTP/1.1\r\n")


async def test_sent_comes_once_where_the_request_goes_out_twice(
    engine: Engine, upstream: EnginePool
) -> None:
    """An idempotent request on a reused connection the engine closed unanswered: it is sent
    again, ``sent`` runs for the first write only."""
    engine.answers = [answer(OK_BODY), answer(b"", close=True), answer(OK_BODY)]
    await _get_body(upstream)
    calls: list[int] = []
    response = await send(upstream, "GET", "/v1/x", {}, None, sent=lambda: calls.append(1))
    assert (await read_all(response), len(engine.requests), calls) == (b"{}", 3, [1])
    release(response)


async def test_no_answer_in_time_is_a_504(engine: Engine) -> None:
    async for upstream in _upstream(engine.port, read_timeout_s=0.2):
        with pytest.raises(UpstreamTimeoutError):
            await send(upstream, "POST", "/v1/x", {}, b"{}")


async def test_a_pooled_connection_gives_its_next_request_the_whole_read_timeout(
    engine: Engine,
) -> None:
    """The read timer outlives an answer in the pool, but the next request's deadline counts
    from its own send: an answer 0.9 s late is in time for a 1.5 s timeout, where a deadline
    left from the first request would have run out 0.3 s before it."""
    engine.answers = [answer(OK_BODY), answer(OK_BODY)]
    engine.delays = {2: 0.9}
    async for upstream in _upstream(engine.port, read_timeout_s=1.5):
        await _get_body(upstream)
        await asyncio.sleep(0.9)  # the first answer's timer is still pending (due at ~1.5 s)
        response, body = await _get_body(upstream)
        assert (response.status, body, engine.connections) == (200, b"{}", 1)


async def test_a_body_that_stops_arriving_is_a_504(engine: Engine) -> None:
    engine.answers = [answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")]
    async for upstream in _upstream(engine.port, read_timeout_s=0.2):
        response = await send(upstream, "POST", "/v1/x", {}, b"{}")
        assert await read_chunk(response) == b"12345"
        with pytest.raises(UpstreamTimeoutError):
            await read_chunk(response)
        release(response)


async def test_a_refused_connection_is_a_502() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async for upstream in _upstream(port):
        with pytest.raises(UpstreamUnavailableError) as caught:
            await send(upstream, "GET", "/health", {}, None)
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)


async def test_a_body_left_unread_closes_its_connection(
    engine: Engine, upstream: EnginePool
) -> None:
    """Closing is how vLLM learns the client is gone: it aborts the request on the drop."""
    engine.answers = [
        answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345"),
        answer(OK_BODY),
    ]
    response = await send(upstream, "POST", "/v1/x", {}, b"{}")
    assert await read_chunk(response) == b"12345"
    release(response)
    await _get_body(upstream)
    assert engine.connections == 2


async def test_a_whole_body_left_unread_never_reaches_the_next_request(
    engine: Engine, upstream: EnginePool
) -> None:
    """The engine's answer arrived in full, but the relay stopped before taking it (its client
    left): those bytes are dropped with their connection, not read by the next request."""
    engine.answers = [answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"), answer(OK_BODY)]
    response = await send(upstream, "POST", "/v1/x", {}, b"{}")
    for _ in range(5):
        await asyncio.sleep(0)  # turns of the loop: the body arrives, unread
    release(response)
    _, body = await _get_body(upstream)
    assert body == b"{}"


async def test_bytes_on_an_idle_connection_never_reach_the_next_request(
    engine: Engine, upstream: EnginePool
) -> None:
    """An engine that writes while nothing was asked (a stray second answer): the connection is
    dropped, and the next request reads its own answer on a new one."""
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    engine.answers = [answer(chunked), answer(OK_BODY)]
    await _get_body(upstream)
    engine.writers[0].write(b"st")  # no line end: nothing a parser could reject on its own
    await engine.writers[0].drain()
    for _ in range(5):
        await asyncio.sleep(0)  # loop turns: the stray bytes arrive at the idle connection
    _, body = await _get_body(upstream)
    assert (body, engine.connections) == (b"{}", 2)


async def test_a_slow_reader_stops_the_engine_socket(engine: Engine, upstream: EnginePool) -> None:
    """Bytes the relay has not taken yet are bounded: past the high-water mark the socket stops
    reading and the engine's own send buffer fills, instead of the sidecar's memory; and it
    stays stopped until the reader comes back for more."""
    size = 16 * 1024 * 1024
    engine.answers = [answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)]
    response = await send(upstream, "POST", "/v1/x", {}, b"{}")
    connection = response._connection
    assert connection is not None
    # Loop turns, as many as it takes (bounded), for the engine to write past the mark.
    transport = connection.transport
    assert transport is not None
    for _ in range(100_000):
        if not transport.is_reading():
            break
        await asyncio.sleep(0)
    assert not transport.is_reading(), "the engine socket was never paused"
    first = await read_chunk(response)
    # What was held when reading stopped: the mark, plus at most one socket read past it.
    assert HIGH_WATER <= len(first) < HIGH_WATER + 1024 * 1024
    # Taken, not yet written on: the socket is read again only when the reader comes back.
    assert not transport.is_reading()
    total = len(first) + len(await read_all(response))
    assert total == size
    release(response)


# Sizes drawn first: left to itself, st.binary favours a few bytes, and chunks this short never
# show a parser that mishandles long ones.
PAYLOADS = st.lists(
    st.integers(1, 300).flatmap(lambda n: st.binary(min_size=n, max_size=n)), max_size=12
)


@dataclass
class _Asked:
    """A connection with a request on it, and the loop its reads run on."""

    loop: asyncio.AbstractEventLoop
    connection: EngineConnection

    def read(self) -> bytes:
        """One read, as the relay's task makes it (there must be something to read)."""
        return self.loop.run_until_complete(self.connection.read())

    def read_rest(self) -> bytes:
        """Every body byte not read yet, up to the answer's end (it must have ended)."""
        out = b""
        while piece := self.read():
            out += piece
        return out


@contextlib.contextmanager
def _asked() -> Iterator[_Asked]:
    """A connection over a real socket with a request written on it; the test then plays the
    engine's answer into it, read by read, as the loop would."""
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    try:
        connected = loop.create_connection(lambda: EngineConnection(loop, 5.0), sock=ours)
        transport, connection = loop.run_until_complete(connected)
        try:
            connection.send(b"POST /v1/x HTTP/1.1\r\nHost: e\r\n\r\n", head_request=False)
            yield _Asked(loop, connection)
        finally:
            transport.abort()
            loop.run_until_complete(asyncio.sleep(0))  # its connection_lost
    finally:
        theirs.close()
        loop.close()


def _reads(raw: bytes, cuts: list[int]) -> list[bytes]:
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True) if raw[a:b]]


@settings(max_examples=200, deadline=None)
@given(PAYLOADS, st.lists(st.booleans(), max_size=12), st.data())
def test_any_chunked_body_split_anywhere_reads_back_whole(
    payloads: list[bytes], extended: list[bool], data: st.DataObject
) -> None:
    """Chunks of any sizes, some with extensions, cut at any bytes: the same body, and its end."""
    body = b"".join(
        b"%x%s\r\n%s\r\n" % (len(p), b";x=1" if i < len(extended) and extended[i] else b"", p)
        for i, p in enumerate(payloads)
    )
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))
    with _asked() as asked:
        for read in _reads(raw, cuts):
            asked.connection.data_received(read)
        assert asked.connection.phase is Phase.COMPLETE
        assert asked.read_rest() == b"".join(payloads)


@settings(max_examples=200, deadline=None)
@given(PAYLOADS, st.data())
def test_a_sink_gets_the_body_in_order_and_never_its_last_bytes(
    payloads: list[bytes], data: st.DataObject
) -> None:
    """The relay's push path: pieces go to the sink as they arrive; one it declines, and all
    after it, wait for the next read, in order; the bytes that end the body are always the
    read's, so they can leave with the terminating chunk."""
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads)
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=10)))
    out: list[bytes] = []
    declined = False
    with _asked() as asked:
        connection = asked.connection

        def sink(piece: bytes) -> bool:
            nonlocal declined
            assert connection.phase is Phase.BODY, "the body's last bytes reached the sink"
            if data.draw(st.booleans(), label="take"):
                out.append(piece)
                return True
            declined = True
            return False

        connection.push_to(sink)
        for read in _reads(raw, cuts):
            connection.data_received(read)
            if declined:  # the sink is detached: the relay's task reads, then attaches it again
                out.append(asked.read())
                declined = False
                connection.push_to(sink)
        assert connection.phase is Phase.COMPLETE
        assert b"".join(out) + asked.read_rest() == b"".join(payloads)


def test_a_sink_waits_behind_pieces_not_yet_read() -> None:
    """Attaching a sink while body bytes wait for a read leaves it detached: the next read gets
    them first, so nothing overtakes them."""
    taken: list[bytes] = []

    def sink(piece: bytes) -> bool:
        taken.append(piece)
        return True

    with _asked() as asked:
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        asked.connection.data_received(head + b"3\r\nabc\r\n")
        asked.connection.push_to(sink)
        asked.connection.data_received(b"3\r\ndef\r\n")
        assert (taken, asked.read()) == ([], b"abcdef")


ANSWER_BYTES = st.one_of(
    st.binary(max_size=200),
    st.lists(
        st.sampled_from(
            [
                b"HTTP/1.1 200 OK\r\n",
                b"HTTP/1.0 204 x\r\n",
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"Content-Length: 3\r\n",
                b"Transfer-Encoding: chunked\r\n",
                b"X: a\x00b\r\n",
                b"X: a\nb\r\n",
                b"\r\n",
                b"\n",
                b"3\r\nabc\r\n",
                b"0\r\n\r\n",
                b"zz\r\n",
                b"abc",
                b"Connection: close\r\n",
                b"\x00",
                b"\xff",
            ]
        ),
        max_size=12,
    ).map(b"".join),
)


@settings(max_examples=300, deadline=None)
@given(ANSWER_BYTES, st.data())
def test_any_answer_is_parsed_or_refused_never_raised(raw: bytes, data: st.DataObject) -> None:
    """Whatever the engine sends, cut anywhere: the connection reads it, or fails with an
    EngineProtocolError the client sees as a 502; no other error escapes the parser. Where it
    reads it, its phase is what it was sent: nothing (sent), part of a head (head; an interim
    1xx answer is skipped), a whole final head (body, or complete: kept, or spent)."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    with _asked() as asked:
        connection = asked.connection
        for read in _reads(raw, cuts):
            connection.data_received(read)
        phase, head = connection.phase, connection.head
        if phase is Phase.BROKEN:
            assert isinstance(connection.error, EngineProtocolError)
        elif not raw:
            assert (phase, head) == (Phase.SENT, None)
        elif head is None:
            assert phase is Phase.HEAD
        else:
            assert 200 <= head.status < 600
            assert phase in (Phase.BODY, Phase.COMPLETE, Phase.SPENT)
