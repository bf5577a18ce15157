"""sidecar.edge.http.server under a handler written for each test, over raw loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from multidict import CIMultiDict
from structlog.testing import capture_logs

from sidecar.core.errors import RequestError
from sidecar.edge.http.limits import EdgeLimits
from sidecar.edge.http.request import Request
from sidecar.edge.http.response import Answer, Response, StreamResponse
from sidecar.edge.http.server import Handler, HttpServer
from sidecar.edge.openai_errors import error_response
from sidecar.entry.listen import bind
from tests.servers import connected, until

GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
DEFAULT_LIMITS = EdgeLimits()
# serve(handler, limits=DEFAULT_LIMITS, *, max_body_bytes=1024) -> (server, port)
Serve = Callable[..., Awaitable[tuple[HttpServer, int]]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start a HttpServer for a handler on a loopback port; every one is closed afterwards."""
    servers: list[HttpServer] = []

    async def start(
        handler: Handler, limits: EdgeLimits = DEFAULT_LIMITS, *, max_body_bytes: int = 1024
    ) -> tuple[HttpServer, int]:
        sock = bind("127.0.0.1", 0)
        server = HttpServer(handler, limits, max_body_bytes=max_body_bytes)
        await server.start(sock)
        servers.append(server)
        return server, sock.getsockname()[1]

    yield start
    for server in servers:
        await server.close(0.5)


async def until_close(port: int, data: bytes) -> bytes:
    """Send ``data`` on a new connection and read everything up to the server's close."""
    async with connected(port) as (reader, writer):
        writer.write(data)
        return await to_close(reader)


async def to_close(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes (cleanly or with a reset)."""
    data = bytearray()
    with contextlib.suppress(ConnectionResetError):
        while chunk := await reader.read(65536):
            data += chunk
    return bytes(data)


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One answer framed by Content-Length: its head (without the blank line) and its body."""
    head = (await reader.readuntil(b"\r\n\r\n"))[:-4]
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    assert length is not None
    return head, await reader.readexactly(int(length[1]))


async def read_chunks(reader: asyncio.StreamReader) -> list[bytes]:
    """A chunked body's pieces, up to and including its last chunk and blank line."""
    pieces = []
    while size := int(await reader.readline(), 16):
        pieces.append((await reader.readexactly(size + 2)).removesuffix(b"\r\n"))
    assert await reader.readline() == b"\r\n"  # the terminator, no trailer fields
    return pieces


def post(path: str, body: bytes) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


class Stuck:
    """A handler that never answers: it says when it started and when it was cancelled."""

    def __init__(self) -> None:
        self.started, self.cancelled = asyncio.Event(), asyncio.Event()

    async def __call__(self, request: Request) -> Answer:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        raise AssertionError("unreachable")


async def test_a_failing_handler_gets_a_json_500_and_the_server_lives_on(serve: Serve) -> None:
    """A handler bug answers a clean JSON 500 (no traceback), then the next client is served."""

    async def handler(request: Request) -> Answer:
        if request.raw_path == "/boom":
            raise RuntimeError("secret detail")
        return Response(200, b"fine")

    _server, port = await serve(handler)
    with capture_logs() as logs:
        data = await until_close(port, b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 ")
    assert json.loads(body)["error"]["code"] == "internal_error"
    assert not re.search(rb"Traceback|secret", data)
    assert [e["event"] for e in logs] == ["proxy_handler_failed"]
    async with connected(port) as (reader, writer):
        writer.write(GET)
        head, body = await read_answer(reader)
    assert (head.split(b"\r\n")[0], body) == (b"HTTP/1.1 200 OK", b"fine")


async def test_a_field_with_a_line_break_becomes_a_500_and_is_never_sent(serve: Serve) -> None:
    """A header value carrying CRLF cannot inject a field: the client gets a 500 instead."""

    async def handler(request: Request) -> Answer:
        return Response(200, b"x", {"X-Bad": "a\r\nInjected: 1"})

    _server, port = await serve(handler)
    data = await until_close(port, GET)
    assert data.startswith(b"HTTP/1.1 500 ")
    assert b"Injected" not in data


async def test_a_handler_failing_mid_stream_cuts_the_connection(serve: Serve) -> None:
    """A stream broken by a handler bug ends without the last chunk, so the client sees a cut."""

    async def handler(request: Request) -> Answer:
        response = StreamResponse()
        await response.prepare(request)
        await response.write(b"a")
        raise RuntimeError("mid-stream")

    _server, port = await serve(handler)
    data = await until_close(port, GET)
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert data.endswith(b"\r\n\r\n1\r\na\r\n")
    assert b"0\r\n\r\n" not in data.partition(b"\r\n\r\n")[2]


async def test_a_client_hanging_up_cancels_its_handler(serve: Serve) -> None:
    """A client gone mid-request stops its handler's work and frees its connection slot."""
    stuck = Stuck()
    server, port = await serve(stuck)
    async with connected(port) as (_reader, writer):
        writer.write(GET)
        await stuck.started.wait()
        assert server.count.open == 1
    async with asyncio.timeout(2):
        await stuck.cancelled.wait()
    assert server.count.open == 0


async def test_a_pipelined_post_waits_for_the_answer_before_it(serve: Serve) -> None:
    """Pipelined requests run one at a time, answered in order, the second with its whole body."""
    order: list[str] = []
    first_started, release = asyncio.Event(), asyncio.Event()

    async def handler(request: Request) -> Answer:
        order.append(f"{request.raw_path} start")
        if request.raw_path == "/first":
            first_started.set()
            await release.wait()
            order.append("/first end")
            return Response(200, b"one")
        return Response(200, await request.read())

    _server, port = await serve(handler)
    async with connected(port) as (reader, writer):
        writer.write(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n" + post("/second", b"hello"))
        await first_started.wait()
        release.set()
        answers = [await read_answer(reader), await read_answer(reader)]
    assert order == ["/first start", "/first end", "/second start"]
    assert [body for _head, body in answers] == [b"one", b"hello"]


async def test_shutdown_ends_a_stuck_handler_in_time(serve: Serve) -> None:
    """Shutdown does not wait past its timeout for a stuck handler; its client sees the close."""
    stuck = Stuck()
    server, port = await serve(stuck)
    async with connected(port) as (reader, writer):
        writer.write(GET)
        await stuck.started.wait()
        async with asyncio.timeout(2):
            await server.close(0.2)
            await stuck.cancelled.wait()
        assert await to_close(reader) == b""


async def test_shutdown_makes_a_running_answer_the_last(serve: Serve) -> None:
    """A request answered while the server shuts down says Connection: close, and its
    connection closes after it, though its client asked to keep it."""
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(request: Request) -> Answer:
        started.set()
        await release.wait()
        return Response(200, b"done")

    server, port = await serve(slow)
    async with connected(port) as (reader, writer):
        writer.write(GET)
        await started.wait()
        closing = asyncio.create_task(server.close(2.0))
        await asyncio.sleep(0)  # the shutdown has begun
        release.set()
        head, body = await read_answer(reader)
        assert (body, b"Connection: close" in head.split(b"\r\n")) == (b"done", True)
        assert await to_close(reader) == b""
        await closing


async def streamed(request: Request) -> Answer:
    if request.raw_path == "/next":
        return Response(200, b"next")
    response = StreamResponse()
    await response.prepare(request)
    for piece in (b"a", b"b", b"c"):
        await response.write(piece)
    await response.write_eof(b"last")
    return response


async def test_a_stream_is_chunked_for_http11(serve: Serve) -> None:
    """An HTTP/1.1 client gets each write as one chunk, the last bytes, then the terminator."""
    _server, port = await serve(streamed)
    async with connected(port) as (reader, writer):
        writer.write(GET)
        head = await reader.readuntil(b"\r\n\r\n")
        assert b"Transfer-Encoding: chunked" in head
        assert await read_chunks(reader) == [b"a", b"b", b"c", b"last"]


async def test_a_stream_answers_head_with_no_body_and_keeps_the_connection(serve: Serve) -> None:
    """A HEAD gets the stream's head alone; the next request's answer follows at once."""
    _server, port = await serve(streamed)
    async with connected(port) as (reader, writer):
        writer.write(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        writer.write(b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = await read_answer(reader)  # any body bytes of the HEAD's would come first
    assert (head.split(b"\r\n")[0], body) == (b"HTTP/1.1 200 OK", b"next")


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(post("/", b"x" * 100), id="declared-length"),
        pytest.param(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"8\r\nxxxxxxxx\r\n" * 3,
            id="chunked-past-the-limit",
        ),
    ],
)
async def test_a_body_over_the_limit_gets_a_413_and_a_close(serve: Serve, raw: bytes) -> None:
    """A body past max_body_bytes, declared or counted as it arrives, reads a 413 and then the
    close."""

    async def handler(request: Request) -> Answer:
        try:
            await request.read()
        except RequestError as exc:
            return error_response(exc)
        return Response(200, b"read")

    _server, port = await serve(handler, max_body_bytes=10)
    async with connected(port) as (reader, writer):
        writer.write(raw)
        head, body = await read_answer(reader)
        assert await to_close(reader) == b""
    assert head.startswith(b"HTTP/1.1 413 ")
    assert json.loads(body)["error"]["code"] == "body_too_large"


async def test_a_head_past_its_deadline_gets_a_408(serve: Serve) -> None:
    """A client that sends half a head is answered 408 and closed once the deadline passes."""
    server, port = await serve(streamed, EdgeLimits(header_timeout_s=0.2))
    data = await until_close(port, b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert data.startswith(b"HTTP/1.1 408 ")
    assert server.count.head_timeouts == 1


async def test_a_client_that_does_not_read_gets_no_more_answers_queued(serve: Serve) -> None:
    """Pipelined requests from a client that reads nothing: two are served, the second's answer
    the connection's last (it was sent ahead of the client's reads), and the rest never run;
    once it reads, both answers arrive whole, in order, then the connection's end."""
    served: list[int] = []
    big = b"y" * (4 << 20)  # past any loopback socket buffer

    async def handler(request: Request) -> Answer:
        served.append(int(request.raw_path.strip("/")))
        return Response(200, big)

    server, port = await serve(handler)
    requests = b"".join(b"GET /%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(20))
    async with connected(port, timeout_s=10) as (reader, writer):
        writer.write(requests)
        (connection,) = server.connections

        async def full() -> bool:
            return connection.paused

        assert await until(full)
        for _ in range(200):  # loop turns, not time: the server gets every chance to go on
            await asyncio.sleep(0)
        assert served == [0]
        heads = []
        for i in range(2):
            head, body = await read_answer(reader)
            heads.append(head)
            assert head.startswith(b"HTTP/1.1 200 "), i
            assert len(body) == len(big), i
        assert await to_close(reader) == b""
    assert served == [0, 1]
    assert [b"Connection: close" in head for head in heads] == [False, True]


async def test_a_field_given_twice_is_sent_twice(serve: Serve) -> None:
    """Two Set-Cookie fields (as an engine may send) both reach the client, in order."""

    async def handler(_request: Request) -> Answer:
        return Response(200, b"ok", CIMultiDict([("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")]))

    _server, port = await serve(handler)
    async with connected(port) as (reader, writer):
        writer.write(GET)
        head, body = await read_answer(reader)
    assert re.findall(rb"(?im)^set-cookie: *(\S+)", head) == [b"a=1", b"b=2"]
    assert body == b"ok"


async def test_a_handler_cancelled_from_outside_ends_its_connection(serve: Serve) -> None:
    """A request stopped without an answer (a drain's stop the handler did not answer) ends its
    connection: the client reads EOF instead of waiting forever."""
    tasks: list[asyncio.Task[None]] = []
    stuck = Stuck()

    async def handler(request: Request) -> Answer:
        assert request.task is not None
        tasks.append(request.task)
        return await stuck(request)

    _server, port = await serve(handler)
    async with connected(port) as (reader, writer):
        writer.write(GET)
        await stuck.started.wait()
        tasks[0].cancel()
        assert await to_close(reader) == b""
