"""SSE framing, the push path's writes, and the in-band error that ends a broken stream."""

from __future__ import annotations

import asyncio
import json
from typing import cast

import pytest
from multidict import CIMultiDict

from sidecar.core.errors import UpstreamTimeoutError, UpstreamUnavailableError
from sidecar.edge.http.request import Request, Wire
from sidecar.edge.http.response import StreamResponse
from sidecar.edge.proxy.relay import _Relay, in_band_error
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


class _Socket(asyncio.Transport):
    """The client's side as the relay sees it: a buffer with room, and what was written."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (16_384, 65_536)


class _Wire:
    lost = paused = False

    def keeps(self, request: Request) -> bool:
        return True


async def _prepared(
    version: tuple[int, int] = (1, 1), *, head_with_body: bool = False
) -> tuple[_Socket, _Relay]:
    """A relay over a prepared streamed answer to a client on ``version``, and its socket."""
    socket = _Socket()
    request = Request(
        "POST", "/v1/chat/completions", version, CIMultiDict(), transport=socket,
        wire=cast(Wire, _Wire()), client_max_size=1 << 20, keep_alive=True, body_exists=False,
    )  # fmt: skip
    response = StreamResponse(200, head_with_body=head_with_body)
    await response.prepare(request)
    return socket, _Relay(request, response, 10.0, EventFramer())


async def test_push_writes_whole_events_each_as_one_chunk() -> None:
    """Each push goes out as one chunk of the events it completed; an event cut across reads
    goes out once it is whole."""
    socket, relay = await _prepared()
    socket.written.clear()
    assert relay.push(b"data: 1\n\n")
    assert relay.push(b"data: 2\n\ndata: 3")
    assert relay.push(b"\n\n")
    assert socket.written == [
        b"9\r\ndata: 1\n\n\r\n",
        b"9\r\ndata: 2\n\n\r\n",  # what was whole of that read
        b"9\r\ndata: 3\n\n\r\n",  # its tail, once the blank line came
    ]


async def test_a_held_head_leaves_with_the_first_event() -> None:
    """Where the head waits for the first body bytes, it goes out with the first event, in one
    write; the events after it go on their own."""
    socket, relay = await _prepared(head_with_body=True)
    assert socket.written == []
    assert relay.push(b"data: 1\n\n")
    assert relay.push(b"data: 2\n\n")
    first, second = socket.written
    head, _, body = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert body == b"9\r\ndata: 1\n\n\r\n"
    assert second == b"9\r\ndata: 2\n\n\r\n"


async def test_an_unchunked_answer_carries_bare_events() -> None:
    """An HTTP/1.0 client's answer is not chunked: every event goes out as bare data."""
    socket, relay = await _prepared((1, 0))
    socket.written.clear()
    assert relay.push(b"data: 1\n\n")
    assert relay.push(b"data: 2\n\n")
    assert socket.written == [b"data: 1\n\n", b"data: 2\n\n"]


class _StalledWire(_Wire):
    """A client that stopped reading with its buffer between the low and high marks: writing
    is paused, and nothing ever drains."""

    paused = True

    async def drain(self) -> None:
        await asyncio.Future()


async def test_a_write_while_paused_has_a_deadline_though_the_buffer_has_room() -> None:
    """Paused under the high-water mark, the push declines and the task's write ends
    client_stalled at the write deadline instead of waiting on the drain for ever."""
    socket, relay = await _prepared()
    relay.request.wire = cast(Wire, _StalledWire())
    relay.write_timeout_s = 0.01
    aborted: list[bool] = []
    socket.abort = lambda: aborted.append(True)  # type: ignore[method-assign]
    assert not relay.push(b"data: 1\n\n")
    assert await relay.write(b"data: 1\n\n") == "client_stalled"
    assert aborted == [True]
