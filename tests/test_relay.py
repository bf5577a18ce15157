"""SSE framing, the in-band error that ends a broken stream, and what a streamed answer's client
receives, write by write, as a scripted engine on a real loopback socket sends its body."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from multidict import CIMultiDict

from sidecar.core.errors import UpstreamTimeoutError, UpstreamUnavailableError
from sidecar.edge.engine.client import release, send
from sidecar.edge.engine.pool import EnginePool
from sidecar.edge.http.request import Request, Wire
from sidecar.edge.proxy.relay import ClientStall, RelayResult, in_band_error, relay_stream
from sidecar.edge.proxy.sse_framing import EventFramer


@pytest.mark.parametrize(
    ("chunks", "out"),
    [
        pytest.param([b"data: 1\n\n"], [b"data: 1\n\n"], id="whole-event-passes-at-once"),
        pytest.param(
            [b"data: 1\n\ndata: 2\n\n"], [b"data: 1\n\ndata: 2\n\n"], id="two-events-one-chunk"
        ),
        pytest.param(
            [b'data: {"a', b'":1}\n\n'], [b"", b'data: {"a":1}\n\n'], id="event-split-in-two"
        ),
        pytest.param(
            [b"data: 1\n\ndata: 2", b"\n\n"], [b"data: 1\n\n", b"data: 2\n\n"], id="tail-held-back"
        ),
    ],
)
def test_framer_passes_whole_events_only(chunks: list[bytes], out: list[bytes]) -> None:
    """Whole events go out as they arrive; a partial event waits for its blank line."""
    framer = EventFramer()
    assert [framer.feed(chunk) for chunk in chunks] == out
    assert framer.flush() == b""


def test_framer_drops_nothing_at_a_clean_end() -> None:
    """At a clean end of stream, bytes without a final blank line are still delivered."""
    framer = EventFramer()
    assert framer.feed(b"data: [DONE]") == b""
    assert framer.flush() == b"data: [DONE]"


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(UpstreamTimeoutError("late"), "upstream_timeout", id="timeout"),
        pytest.param(UpstreamUnavailableError("gone"), "upstream_unavailable", id="reset"),
    ],
)
def test_in_band_error_is_an_openai_error_then_done(exc: Exception, code: str) -> None:
    """A broken stream ends with `data: {"error": ...}` and `data: [DONE]`, like vLLM's own."""
    first, second, rest = in_band_error(exc).split(b"\n\n")  # type: ignore[arg-type]
    error = json.loads(first.removeprefix(b"data: "))["error"]
    assert error["code"] == code
    assert error["message"]
    assert (second, rest) == (b"data: [DONE]", b"")


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
END = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class _Engine:
    """A loopback engine that answers one request with the bytes the test hands it, each as
    one write, when the test hands them over."""

    def __init__(self) -> None:
        self.sends: asyncio.Queue[bytes] = asyncio.Queue()
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            while data := await self.sends.get():
                writer.write(data)
                await writer.drain()
            await reader.read()  # hold the connection until the sidecar drops it


@contextlib.asynccontextmanager
async def _upstream() -> AsyncIterator[tuple[_Engine, EnginePool]]:
    engine = _Engine()
    server = await asyncio.start_server(engine.serve, "127.0.0.1", 0)
    engine.port = server.sockets[0].getsockname()[1]
    upstream = EnginePool(
        f"http://127.0.0.1:{engine.port}", connect_timeout_s=2.0, read_timeout_s=5.0
    )
    try:
        yield engine, upstream
    finally:
        engine.sends.put_nowait(b"")
        upstream.close()
        for writer in engine.writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        server.close()
        await server.wait_closed()


class _Socket(asyncio.Transport):
    """The client's side: a buffer with room, and every write made to it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.aborted = False
        self._wrote = asyncio.Event()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))
        self._wrote.set()

    async def writes(self, count: int) -> list[bytes]:
        """The writes so far, once there are ``count`` of them."""
        async with asyncio.timeout(5):
            while len(self.written) < count:
                self._wrote.clear()
                await self._wrote.wait()
        return self.written

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16_384, 65_536)


class _Wire:
    """A client that reads whatever it is sent; ``paused``: one that stopped reading, with its
    buffer between the low and high marks, so that nothing ever drains."""

    lost = False

    def __init__(self) -> None:
        self.paused = False

    def keeps(self, request: Request) -> bool:
        return True

    async def drain(self) -> None:
        await asyncio.Future()


def _client(socket: _Socket, wire: _Wire, version: tuple[int, int] = (1, 1)) -> Request:
    return Request(
        "POST",
        "/v1/chat/completions",
        version,
        CIMultiDict(),
        transport=socket,
        wire=cast(Wire, wire),
        client_max_size=1 << 20,
        keep_alive=True,
        body_exists=False,
    )


async def _relayed(
    socket: _Socket,
    reads: list[bytes],
    *,
    version: tuple[int, int] = (1, 1),
    wire: _Wire | None = None,
    write_timeout_s: float = 10.0,
) -> RelayResult:
    """Relay an SSE answer whose head goes first and whose body arrives as ``reads``, each sent
    once the client got what the read before it carried."""
    async with _upstream() as (engine, upstream):
        engine.sends.put_nowait(SSE_HEAD)
        answer = await send(upstream, "POST", "/v1/chat/completions", {}, b"{}")
        relay = relay_stream(
            _client(socket, wire or _Wire(), version),
            answer,
            "req-1",
            write_timeout_s=write_timeout_s,
        )
        task = asyncio.create_task(relay)
        for n, read in enumerate(reads, start=1):
            await socket.writes(n)  # the head, then what each read before this one carried
            engine.sends.put_nowait(read)
        result = await task
        release(answer)
        return result


async def test_whole_events_go_out_one_write_per_read() -> None:
    """Each read of the engine's goes to the client as one chunk of the events it completed; an
    event cut across reads goes out once it is whole; the end of the body is the last write."""
    socket = _Socket()
    reads = [chunk(b"data: 1\n\n"), chunk(b"data: 2\n\ndata: 3"), chunk(b"\n\n"), END]
    result = await _relayed(socket, reads)
    assert result.end == "completed"
    head, *body = socket.written
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Transfer-Encoding: chunked" in head
    assert b"X-Request-Id: req-1" in head
    assert body == [
        b"9\r\ndata: 1\n\n\r\n",
        b"9\r\ndata: 2\n\n\r\n",  # what was whole of that read
        b"9\r\ndata: 3\n\n\r\n",  # its tail, once the blank line came
        b"0\r\n\r\n",
    ]


async def test_a_head_sent_with_its_first_event_leaves_with_it() -> None:
    """Where the engine's head and first event come in one read, the client's head goes out with
    that event, in one write; the events after it go on their own."""
    socket = _Socket()
    async with _upstream() as (engine, upstream):
        engine.sends.put_nowait(SSE_HEAD + chunk(b"data: 1\n\n"))
        answer = await send(upstream, "POST", "/v1/chat/completions", {}, b"{}")
        relay = relay_stream(_client(socket, _Wire()), answer, "req-1", write_timeout_s=10.0)
        task = asyncio.create_task(relay)
        await socket.writes(1)
        engine.sends.put_nowait(chunk(b"data: 2\n\n") + END)
        assert (await task).end == "completed"
        release(answer)
    first, *rest = socket.written
    head, _, body = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert body == b"9\r\ndata: 1\n\n\r\n"
    assert b"".join(rest) == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"


async def test_an_http10_client_gets_bare_events_ended_by_the_close() -> None:
    """An HTTP/1.0 client's answer is not chunked: every event goes out as bare data, and the
    connection's close is the body's end."""
    socket = _Socket()
    result = await _relayed(
        socket, [chunk(b"data: 1\n\n"), chunk(b"data: 2\n\n"), END], version=(1, 0)
    )
    assert result.end == "completed"
    head, *body = socket.written
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Connection: close" in head
    assert b"Transfer-Encoding" not in head
    assert body == [b"data: 1\n\n", b"data: 2\n\n"]


async def _stalled(socket: _Socket, wire: _Wire, **options: Any) -> RelayResult:
    """Relay an SSE answer whose client stops reading once it has the head (writing paused,
    under the high-water mark, so nothing drains): its first event's write waits on it."""
    async with _upstream() as (engine, upstream):
        engine.sends.put_nowait(SSE_HEAD)
        answer = await send(upstream, "POST", "/v1/chat/completions", {}, b"{}")
        task = asyncio.create_task(relay_stream(_client(socket, wire), answer, "req-1", **options))
        await socket.writes(1)
        wire.paused = True
        engine.sends.put_nowait(chunk(b"data: 1\n\n"))
        result = await task
        release(answer)
    return result


async def test_a_client_that_stops_reading_is_cut_off_at_the_write_deadline() -> None:
    """A client whose buffer stopped draining (writing paused, though under the high-water mark)
    is not waited on for ever: the next event's write waits for the drain under the write
    deadline, and the stream ends client_stalled, its connection aborted, nothing after it."""
    socket, wire = _Socket(), _Wire()
    result = await _stalled(socket, wire, write_timeout_s=0.01)
    assert result.end == "client_stalled"
    assert socket.aborted
    assert socket.written[1:] == [b"9\r\ndata: 1\n\n\r\n"]  # into the full buffer; no end


async def test_a_stalled_client_gives_its_place_up_once_a_request_waits_for_one() -> None:
    """The client stopped reading after the head: while nobody waits for a permit its next
    event's write is left to the 10 s deadline (asked each 0.01 s stall, three times, nobody
    waiting); the first stall that finds a request waiting ends the stream client_stalled, its
    connection aborted, long before the deadline."""
    asked: list[bool] = []

    def contended() -> bool:
        asked.append(len(asked) >= 3)
        return asked[-1]

    socket, wire = _Socket(), _Wire()
    result = await _stalled(socket, wire, write_timeout_s=10.0, stall=ClientStall(contended, 0.01))
    assert result.end == "client_stalled"
    assert socket.aborted
    assert asked == [False, False, False, True]
