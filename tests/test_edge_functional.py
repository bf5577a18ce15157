"""The bounded edge over real sockets: no request past admission, no 500, no echo, bounded time."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from structlog.testing import capture_logs

from sidecar.edge.http.limits import BodyBudget
from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double, numbered_events
from tests.servers import admin_url, error_of, proxy_url, scrape, sidecars, sse_events, until

__all__ = ["double"]

Start = Callable[..., Awaitable[SidecarServer]]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
COMPLETION = {"model": "m", "prompt": "hi", "max_tokens": 5}


@pytest.fixture
async def edge(double: EngineDouble) -> AsyncIterator[Start]:
    """Start sidecars in front of the recording double; stopped at teardown."""
    async with sidecars(double.url) as start:
        yield start


async def exchange(port: int, data: bytes, timeout_s: float = 3.0) -> bytes:
    """Send raw bytes, read until the server closes (bounded in time)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        async with asyncio.timeout(timeout_s):
            return await reader.read(65_536)
    finally:
        writer.close()


def granted(server: SidecarServer) -> int:
    return server.bulkhead.snapshot().granted_total


@pytest.mark.parametrize(
    ("path", "seen"),
    [
        pytest.param("/v1/./chat/completions", "/v1/chat/completions", id="dot"),
        pytest.param("/v1/x/../chat/completions", "/v1/chat/completions", id="dot-dot"),
        pytest.param("//v1//chat/completions", "/v1/chat/completions", id="slashes"),
        pytest.param("/v1/%2E/chat/completions", "/v1/chat/completions", id="encoded-dot"),
        pytest.param("/v1/./completions", "/v1/completions", id="completions-dot"),
    ],
)
async def test_every_spelling_passes_admission_and_the_admitted_path_is_forwarded(
    edge: Start, double: EngineDouble, path: str, seen: str
) -> None:
    """Dot segments and repeated slashes are admitted as the path the engine sees, and sent so."""
    server = await edge()
    body = {**CHAT, "prompt": "hi"} if "chat" not in seen else CHAT
    async with aiohttp.ClientSession() as s, s.post(proxy_url(server) + path, json=body) as r:
        assert r.status == 200
    assert double.seen == [("POST", seen)]
    assert granted(server) == 1


@pytest.mark.parametrize(
    ("path", "body", "permits"),
    [
        pytest.param("/v1/responses", {"input": "hi", "max_output_tokens": 5}, 1, id="responses"),
        pytest.param("/v1/embeddings", {"input": "hi"}, 1, id="other-post"),
        pytest.param("/v1/audio/speech", {"input": "hi"}, 1, id="unknown-post"),
        pytest.param("/tokenize", {"prompt": "hi"}, 0, id="free-tokenize"),
    ],
)
@pytest.mark.parametrize("admission", ["count", "tokens", "adaptive"])
async def test_every_post_holds_a_permit_except_the_free_paths(
    edge: Start,
    double: EngineDouble,
    path: str,
    body: dict[str, object],
    *,
    permits: int,
    admission: str,
) -> None:
    """Generating routes beyond chat and completions take a permit in every admission mode, priced
    in the mode's own unit (a permit, KV bytes or tokens); /tokenize does not."""
    server = await edge(SIDECAR_ADMISSION=admission)
    async with aiohttp.ClientSession() as s, s.post(proxy_url(server) + path, json=body) as r:
        assert r.status == 200
    assert granted(server) == permits
    assert double.generating() == permits


async def test_responses_budget_is_enforced(edge: Start, double: EngineDouble) -> None:
    """/v1/responses is priced by max_output_tokens: above the budget it never reaches the GPU."""
    server = await edge()
    body = {"input": "hi", "max_output_tokens": 10_000}
    async with (
        aiohttp.ClientSession() as s,
        s.post(proxy_url(server) + "/v1/responses", json=body) as r,
    ):
        assert r.status == 400
        assert error_of(await r.read())["param"] == "max_output_tokens"
    assert double.seen == []


UNPRICEABLE = [
    pytest.param(b'{"model":"m","prompt":"\\ud800","max_tokens":2}', 400, id="lone-surrogate"),
    pytest.param(b'{"model":"m","prompt":"\\udc00x","max_tokens":2}', 400, id="lone-low-surrogate"),
    pytest.param(b'{"prompt":"\\ud83d\\ude00","max_tokens":2}', 200, id="surrogate-pair"),
    pytest.param(b'{"prompt":"hi","max_tokens":' + b"9" * 5000 + b"}", 400, id="5000-digits"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, 400, id="nested-100000"),
    pytest.param(b'{"prompt": "hi", "max_tokens": 1e999}', 400, id="infinite-number"),
    pytest.param('{"prompt":"hi","max_tokens":2}'.encode("utf-16"), 400, id="utf-16-body"),
    pytest.param(b'\xef\xbb\xbf{"prompt":"hi"}', 400, id="utf-8-bom"),
    pytest.param(b"\xff\xfe\x00", 400, id="not-text"),
]


@pytest.mark.parametrize(("body", "status"), UNPRICEABLE)
async def test_bodies_the_checks_cannot_price_get_a_4xx_never_a_500(
    edge: Start, double: EngineDouble, body: bytes, status: int
) -> None:
    """Each hostile body gets its own answer: priced and sent, or a 400 that never reaches it."""
    server = await edge()
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            proxy_url(server) + "/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        ) as r,
    ):
        assert r.status == status
        if status == 400:
            assert error_of(await r.read())["type"] == "invalid_request_error"
    assert double.generating() == (1 if status == 200 else 0)


async def test_chat_part_text_that_is_not_a_string_is_a_400(edge: Start) -> None:
    """A content part whose text is a number is refused by name, not a crash."""
    server = await edge()
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
    async with (
        aiohttp.ClientSession() as s,
        s.post(proxy_url(server) + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 400
        assert error_of(await r.read())["param"] == "messages"


@pytest.mark.parametrize(
    "content",
    [
        pytest.param([1], id="number"),
        pytest.param([None], id="null"),
        pytest.param([["nested"]], id="array"),
        pytest.param([{"type": "text", "text": "ok"}, True], id="object-then-bool"),
    ],
)
async def test_chat_content_arrays_of_non_objects_are_a_400_and_reach_nothing(
    edge: Start, double: EngineDouble, content: list[object]
) -> None:
    """A content array whose items are not content parts is refused; the engine never sees it."""
    server = await edge()
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    async with (
        aiohttp.ClientSession() as s,
        s.post(proxy_url(server) + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 400
        error = error_of(await r.read())
    assert (error["param"], error["code"], error["type"]) == (
        "messages",
        "invalid_type",
        "invalid_request_error",
    )
    assert double.seen == []


async def test_a_declared_non_utf8_charset_is_a_415(edge: Start, double: EngineDouble) -> None:
    """Content-Type: application/json; charset=utf-16 is refused before it reaches the engine."""
    server = await edge()
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            proxy_url(server) + "/v1/completions",
            data='{"prompt":"hi"}'.encode("utf-16"),
            headers={"Content-Type": "application/json; charset=utf-16"},
        ) as r,
    ):
        assert r.status == 415
    assert double.seen == []


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/v1%2Fchat/completions", id="encoded-slash"),
        pytest.param("/v1/chat%5Ccompletions", id="encoded-backslash"),
        pytest.param("/v1/%zz", id="bad-escape"),
    ],
)
async def test_ambiguous_paths_are_a_400_and_reach_nothing(
    edge: Start, double: EngineDouble, path: str
) -> None:
    """An encoding that could be read two ways is refused in JSON; the engine sees nothing."""
    server = await edge()
    raw = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}".encode()
    answer = await exchange(server.proxy_port, raw)
    assert answer.startswith(b"HTTP/1.1 400")
    assert b'"ambiguous_path"' in answer
    assert double.seen == []


async def test_a_client_that_stops_reading_loses_its_permit(edge: Start) -> None:
    """A never-reading client: the write deadline ends the stream and the permit comes back."""
    server = await edge(SIDECAR_CLIENT_WRITE_TIMEOUT_MS="300")
    body = json.dumps({**CHAT, "stream": True}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-double: endless\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    _reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port, limit=1024)
    writer.write(head + body)
    try:
        assert await until(lambda: _in_use(server, 1), 5)
        assert await until(lambda: _in_use(server, 0), 10)
    finally:
        writer.close()
    samples = await scrape(admin_url(server) + "/metrics")
    assert samples["sidecar_requests_total{outcome=client_stalled}"] == 1


async def test_clients_that_stop_reading_a_paced_stream_lose_their_permits(
    edge: Start, double: EngineDouble
) -> None:
    """Four clients with a 4 KiB receive buffer that never read a stream paced like a decoding
    engine's: each stream ends client_stalled and its engine connection is closed long before
    the engine is done, instead of the kernel's send buffer soaking the stream up."""
    server = await edge(SIDECAR_CLIENT_WRITE_TIMEOUT_MS="300", SIDECAR_KV_POOL=str(4 * 131_072))
    clients = [await _small_buffer_client(server.proxy_port) for _ in range(4)]
    try:
        for sock in clients:
            sock.send(_streamed_chat("trickle"))
        assert await until(lambda: _in_use(server, 4), 5)
        assert await until(lambda: _in_use(server, 0), 10)
        assert await until(lambda: _length_is(double.trickles, 4), 5)
    finally:
        for sock in clients:
            sock.close()
    assert double.trickles == ["cut"] * 4
    samples = await scrape(admin_url(server) + "/metrics")
    assert samples["sidecar_requests_total{outcome=client_stalled}"] == 4


async def _small_buffer_client(port: int) -> socket.socket:
    """A connected client socket with a 4 KiB receive buffer, which the test never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return sock


async def _length_is(items: list[str], n: int) -> bool:
    return len(items) == n


async def _in_use(server: SidecarServer, n: int) -> bool:
    return server.bulkhead.snapshot().in_use == n


def _streamed_chat(mode: str) -> bytes:
    """A streaming chat request that asks the engine double for ``mode``, then closes."""
    body = json.dumps({**CHAT, "stream": True}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-double: {mode}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close"
        "\r\n\r\n"
    ).encode()
    return head + body


async def test_a_slow_reader_gets_every_event_in_order(edge: Start) -> None:
    """A client slower than the engine (a 4 KiB receive buffer, read a little at a time): the
    relay's socket fills again and again, and every byte still arrives, in order, once."""
    server = await edge()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.proxy_port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    writer.write(_streamed_chat("numbered"))
    received = bytearray()
    async with asyncio.timeout(30):
        while piece := await reader.read(1024):
            received += piece
            await asyncio.sleep(0)  # a loop turn, no time: the reader stays behind the engine
    writer.close()
    answer_head, _, chunked = bytes(received).partition(b"\r\n\r\n")
    assert answer_head.startswith(b"HTTP/1.1 200")
    assert _dechunk(chunked) == b"".join(numbered_events())
    assert await until(lambda: _in_use(server, 0))


async def test_a_paced_stream_reaches_the_client_event_by_event(edge: Start) -> None:
    """Events that each come in a read of their own (the relay passes the engine's chunk on as
    it came): the client's body is a valid chunked one of exactly the engine's events."""
    server = await edge()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    writer.write(_streamed_chat("paced"))
    async with asyncio.timeout(30):
        received = await reader.read(-1)
    writer.close()
    answer_head, _, chunked = received.partition(b"\r\n\r\n")
    assert answer_head.startswith(b"HTTP/1.1 200")
    assert chunked.endswith(b"0\r\n\r\n")
    assert _dechunk(chunked) == b"".join(numbered_events(20))
    assert await until(lambda: _in_use(server, 0))


def _dechunk(data: bytes) -> bytes:
    out, at = bytearray(), 0
    while True:
        end = data.index(b"\r\n", at)
        size = int(data[at:end], 16)
        if size == 0:
            return bytes(out)
        out += data[end + 2 : end + 2 + size]
        at = end + 2 + size + 2
        assert data[at - 2 : at] == b"\r\n", "a chunk did not end where its size said"


async def test_a_broken_plain_body_is_cut_off_not_a_clean_200(edge: Start) -> None:
    """The engine dies mid-body on a non-SSE answer: the client sees an error, not a short body."""
    server = await edge()
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            proxy_url(server) + "/v1/embeddings",
            json={"input": "x"},
            headers={"x-double": "broken"},
        ) as r,
    ):
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    assert await until(lambda: _in_use(server, 0))


async def test_a_crlf_stream_is_relayed_whole(edge: Start) -> None:
    """CRLF-framed events go out as they are, byte for byte."""
    server = await edge()
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            proxy_url(server) + "/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={"x-double": "crlf"},
        ) as r,
    ):
        assert await r.read() == b"data: 1\r\n\r\ndata: [DONE]\r\n\r\n"


async def test_a_head_sent_alone_reaches_the_client_before_the_first_event(
    edge: Start, double: EngineDouble
) -> None:
    """An engine in prefill has sent its head only: the client has its 200 while it waits."""
    server = await edge()
    raw = json.dumps({**CHAT, "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-double: held\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw)
        )
        async with asyncio.timeout(3):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            assert b"text/event-stream" in head
            double.released.set()
            body = await reader.readuntil(b"0\r\n\r\n")
    finally:
        writer.close()
    assert b"data: 1\n\ndata: [DONE]\n\n" in body


async def test_a_head_request_gets_the_engines_head_and_no_body(
    edge: Start, double: EngineDouble
) -> None:
    """HEAD passes without a permit; the answer's fields arrive, its body does not, and the
    connection serves the next request."""
    server = await edge()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    try:
        writer.write(b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(3):
            head = await reader.readuntil(b"\r\n\r\n")
            second = await reader.readuntil(b"\r\n\r\n")
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert b"application/json" in head
    assert second.startswith(b"HTTP/1.1 200")  # the HEAD answer carried no body before it
    assert double.seen == [("HEAD", "/v1/models"), ("GET", "/v1/models")]
    assert granted(server) == 0


async def test_an_answer_in_one_write_is_relayed_whole(edge: Start) -> None:
    """Head, events and end in one read from the engine: every event reaches the client."""
    server = await edge()
    body = {**CHAT, "stream": True}
    headers = {"x-double": "one_write"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(proxy_url(server) + "/v1/chat/completions", json=body, headers=headers) as r,
    ):
        assert (r.status, r.content_type) == (200, "text/event-stream")
        assert await r.read() == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"


async def test_slow_headers_are_closed_at_the_header_deadline(edge: Start) -> None:
    """Slowloris on the head: a 408 in JSON after the deadline, then the connection closes."""
    server = await edge(SIDECAR_HEADER_TIMEOUT_MS="300")
    answer = await exchange(server.proxy_port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    assert answer.startswith(b"HTTP/1.1 408")
    assert b'"header_timeout"' in answer


async def test_a_slow_body_gets_a_408(edge: Start, double: EngineDouble) -> None:
    """Slowloris on the body: the request is refused at the body deadline, nothing forwarded."""
    server = await edge(SIDECAR_BODY_TIMEOUT_MS="300")
    raw = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro'
    answer = await exchange(server.proxy_port, raw)
    assert answer.startswith(b"HTTP/1.1 408")
    assert b'"body_timeout"' in answer
    assert double.seen == []


async def test_a_client_that_expects_100_continue_gets_it_then_its_answer(
    edge: Start, double: EngineDouble
) -> None:
    """curl's way with bodies over 1 KiB: the head alone, a 100 Continue, then the body."""
    server = await edge()
    body = json.dumps({"prompt": "hello", "max_tokens": 5}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    try:
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        async with asyncio.timeout(3):
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            assert double.seen == []
            writer.write(body)
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()
    assert double.seen == [("POST", "/v1/completions")]


@pytest.mark.parametrize(
    ("head", "status"),
    [
        pytest.param(
            b"POST /v1/completions HTTP/1.1\r\nExpect: x-secret-token\r\n",
            b"417",
            id="unknown-expectation",
        ),
        pytest.param(
            b"POST /v1/%2e%2e/%2fcompletions HTTP/1.1\r\nExpect: 100-continue\r\n",
            b"400",
            id="refused-before-the-body",
        ),
    ],
)
async def test_an_expectation_never_sends_a_refused_request_on(
    edge: Start, double: EngineDouble, head: bytes, status: bytes
) -> None:
    """An expectation other than 100-continue is a 417 that does not echo it; a request refused
    before its body is read gets its answer, with no 100 Continue first."""
    server = await edge()
    answer = await exchange(server.proxy_port, head + b"Host: x\r\nContent-Length: 40\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 " + status)
    assert b"100 Continue" not in answer
    assert b"secret" not in answer
    assert double.seen == []


async def test_busy_connections_past_the_cap_are_refused_and_admin_still_answers(
    edge: Start,
) -> None:
    """A flood of half-sent heads up to the cap (none idle): the next connection gets a 503,
    /healthz keeps answering."""
    server = await edge(SIDECAR_MAX_CONNECTIONS="20")
    busy = await connections(server, 20, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
    try:
        assert await until(lambda: _open(server, 20))
        answer = await exchange(server.proxy_port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503")
        assert b'"too_many_connections"' in answer
        async with aiohttp.ClientSession() as s, s.get(admin_url(server) + "/healthz") as r:
            assert r.status == 200
    finally:
        for _reader, writer in busy:
            writer.close()
    assert await until(lambda: _open(server, 0))


async def test_idle_connections_past_the_cap_make_room_longest_idle_first(
    edge: Start, double: EngineDouble
) -> None:
    """20 idle sockets at a cap of 20 no longer refuse everyone new. Each new
    connection closes the longest idle one (here the keep-alive one that was served first) and
    is served."""
    server = await edge(SIDECAR_MAX_CONNECTIONS="20")
    kept = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    kept[1].write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await kept[0].readline()).startswith(b"HTTP/1.1 200")
    # Its whole answer first: only then is it idle, the longest idle, whatever the CPU's speed.
    assert (await kept[0].readuntil(b"0\r\n\r\n")).endswith(b"0\r\n\r\n")
    idle = await connections(server, 19)
    try:
        assert await until(lambda: _open(server, 20))
        answer = await exchange(server.proxy_port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200")
        async with asyncio.timeout(3):
            rest = await kept[0].read()
        assert rest == b""  # closed, with nothing more to say
        assert server.proxy_server is not None
        assert (server.proxy_server.count.evicted, server.proxy_server.count.refused) == (1, 0)
        assert all(not reader.at_eof() for reader, _writer in idle)
    finally:
        kept[1].close()
        for _reader, writer in idle:
            writer.close()


async def test_one_address_is_held_to_its_own_cap(edge: Start, double: EngineDouble) -> None:
    """Past its own cap with no idle connection, a client address is refused 503
    too_many_client_connections, while another address is still served."""
    server = await edge(SIDECAR_MAX_CONNECTIONS_PER_CLIENT="3")
    busy = await connections(server, 3, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
    try:
        assert await until(lambda: _open(server, 3))
        answer = await exchange(server.proxy_port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503")
        assert error_of(answer.partition(b"\r\n\r\n")[2])["code"] == "too_many_client_connections"
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.proxy_port, local_addr=("127.0.0.2", 0)
        )
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(3):
            assert (await reader.read()).startswith(b"HTTP/1.1 200")
        writer.close()
    finally:
        for _reader, writer in busy:
            writer.close()


async def test_a_client_at_its_cap_reuses_its_own_idle_connection(
    edge: Start, double: EngineDouble
) -> None:
    """At its own cap, a client's new connection closes that client's longest idle (kept-alive)
    one, never another client's."""
    server = await edge(SIDECAR_MAX_CONNECTIONS_PER_CLIENT="2")
    other = await asyncio.open_connection(
        "127.0.0.1", server.proxy_port, local_addr=("127.0.0.2", 0)
    )
    mine = await connections(server, 2, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        for reader, _writer in mine:  # each answered, and kept alive: idle
            async with asyncio.timeout(3):
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        assert await until(lambda: _open(server, 3))
        answer = await exchange(server.proxy_port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200")
        assert sorted([await _closes(reader) for reader, _ in mine]) == [False, True]
        assert not other[0].at_eof()
        assert server.proxy_connections is not None
        assert server.proxy_connections.evicted == 1
    finally:
        for _reader, writer in [other, *mine]:
            writer.close()


async def _closes(reader: asyncio.StreamReader) -> bool:
    """Whether the server closes this connection (what is left of an answer read off first)."""
    try:
        async with asyncio.timeout(1):
            await reader.read()
    except TimeoutError:
        return False
    return True


async def connections(
    server: SidecarServer, n: int, send: bytes = b""
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``n`` connections to the proxy port from 127.0.0.1, each having sent ``send``."""
    opened = [await asyncio.open_connection("127.0.0.1", server.proxy_port) for _ in range(n)]
    for _reader, writer in opened:
        writer.write(send)
    return opened


async def _open(server: SidecarServer, n: int) -> bool:
    proxy_count = server.proxy_connections
    return proxy_count is not None and proxy_count.open == n


SECRET = "sk-very-secret-key-123"
MALFORMED = [
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Length: 5\r\n\r\n0\r\n\r\n",
        id="te-and-cl",
    ),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
        b"Content-Length: 30\r\n\r\n{}",
        id="two-content-lengths",
    ),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\n{}\r\n0\r\n\r\n",
        id="bad-chunk-size",
    ),
    pytest.param(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
        id="oversized-header",
    ),
    pytest.param(b"GET /v1/models HTTP/1.1\r\nBad Header\r\n\r\n", id="malformed-header-line"),
    pytest.param(b"GET /v1/models HTTP/1.1\nHost: x\n\n", id="bare-lf"),
    pytest.param(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  more\r\n\r\n", id="obs-fold"),
    pytest.param(b"GET /v1/models HTTP/1.1\r\nHost : x\r\n\r\n", id="space-before-colon"),
    pytest.param(b"GET /v1/models HTTP/1.1\r\nHost: x\x00y\r\n\r\n", id="nul-in-a-field"),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
        id="chunked-not-last",
    ),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
        b'e\r\n{"prompt":"a"}\r\n0\r\n\r\n',
        id="a-coding-before-chunked",
    ),
    pytest.param(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n"
        b'Transfer-Encoding: chunked\r\n\r\ne\r\n{"prompt":"a"}\r\n0\r\n\r\n',
        id="codings-in-two-fields",
    ),
    pytest.param(b"GET /v1/models\r\n\r\n", id="http-0.9"),
    pytest.param(b"BREW /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", id="unknown-method"),
    pytest.param(b"GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", id="http-2-over-http-1"),
    pytest.param(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-A: 1\r\n" * 65 + b"\r\n",
        id="too-many-fields",
    ),
    pytest.param(
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"a" * 5000 * 150,
        id="a-head-that-never-ends",
    ),
]


@pytest.mark.parametrize("raw", MALFORMED)
async def test_malformed_requests_get_json_400s_that_echo_nothing(
    edge: Start, double: EngineDouble, raw: bytes
) -> None:
    """Smuggling and oversized headers: a JSON 4xx, no request bytes echoed, no secret logged."""
    server = await edge()
    with_key = raw.replace(
        b"Host: x\r\n", f"Host: x\r\nAuthorization: Bearer {SECRET}\r\n".encode()
    )
    with capture_logs() as logs:
        answer = await exchange(server.proxy_port, with_key)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split()[1] in (b"400", b"413", b"431")
    assert b"application/json" in head
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert SECRET.encode() not in answer
    assert SECRET not in json.dumps(logs, default=str)
    assert double.generating() == 0


async def test_stalled_bodies_hold_no_slot_of_the_port(edge: Start, double: EngineDouble) -> None:
    """32 connections that declare a body and never send it hold only their own
    connections; every other request on the port is served at once, none gets edge_busy."""
    server = await edge(SIDECAR_BODY_TIMEOUT_MS="30000")
    stalled_head = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
    stalled = await connections(server, 32, stalled_head)
    try:
        assert await until(lambda: _seen_heads(server, 32))
        async with aiohttp.ClientSession() as s:
            async with s.get(proxy_url(server) + "/v1/models") as r:
                assert r.status == 200
            async with s.post(proxy_url(server) + "/v1/completions", json=COMPLETION) as r:
                assert r.status == 200
        assert server.gate.refused == 0
        assert double.seen == [("GET", "/v1/models"), ("POST", "/v1/completions")]
    finally:
        for _reader, writer in stalled:
            writer.close()


async def _seen_heads(server: SidecarServer, n: int) -> bool:
    return server.proxy_connections is not None and server.proxy_connections.open >= n


async def test_bodies_held_at_once_stay_within_the_ports_budget(
    edge: Start, double: EngineDouble
) -> None:
    """A body arriving while others hold the port's body budget is refused 503 (never
    buffered past it); once they end, their bytes come back and the same request is served."""
    server = await edge(SIDECAR_MAX_BUFFERED_BODY_BYTES="1000")
    assert server.proxy_server is not None
    bodies = server.proxy_server.bodies
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 990\r\n\r\n")
    writer.write(b" " * 900)
    body = json.dumps(COMPLETION).encode() + b" " * 300
    try:
        assert await until(lambda: _held(bodies, 900))
        async with aiohttp.ClientSession() as s:
            async with s.post(proxy_url(server) + "/v1/completions", data=body) as r:
                assert r.status == 503
                assert error_of(await r.read())["code"] == "body_budget_full"
                assert r.headers["Retry-After"] == "1"
            writer.close()
            assert await until(lambda: _held(bodies, 0))
            async with s.post(proxy_url(server) + "/v1/completions", data=body) as r:
                assert r.status == 200
    finally:
        writer.close()
        del reader
    assert await until(lambda: _held(bodies, 0))
    assert double.seen == [("POST", "/v1/completions")]


async def test_an_address_holds_only_its_share_of_the_body_budget(
    edge: Start, double: EngineDouble
) -> None:
    """One address holding its share of the body budget is refused 503 client_body_budget_full
    for more, while another address's body is served."""
    server = await edge(
        SIDECAR_MAX_BUFFERED_BODY_BYTES="4000", SIDECAR_MAX_BUFFERED_BODY_BYTES_PER_CLIENT="1000"
    )
    assert server.proxy_server is not None
    bodies = server.proxy_server.bodies
    body = json.dumps(COMPLETION).encode() + b" " * 300
    post = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    _reader, holder = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    holder.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 990\r\n\r\n")
    holder.write(b" " * 900)
    try:
        assert await until(lambda: _held(bodies, 900))
        mine = await exchange(server.proxy_port, post + body)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.proxy_port, local_addr=("127.0.0.2", 0)
        )
        writer.write(post + body)
        async with asyncio.timeout(3):
            other = await reader.read()
        writer.close()
    finally:
        holder.close()
    assert mine.startswith(b"HTTP/1.1 503")
    assert error_of(mine.partition(b"\r\n\r\n")[2])["code"] == "client_body_budget_full"
    assert other.startswith(b"HTTP/1.1 200")
    samples = await scrape(admin_url(server) + "/metrics")
    assert samples["sidecar_requests_total{outcome=client_body_budget_full}"] == 1


async def test_a_fast_start_does_not_buy_a_stalled_body_its_timeout(edge: Start) -> None:
    """A body sent fast, then stalled: cut off 408 body_timeout by the pace of its last window,
    long before the 30 s timeout its fast start would have bought on average."""
    server = await edge(
        SIDECAR_BODY_TIMEOUT_MS="30000",
        SIDECAR_BODY_MIN_RATE="1000",
        SIDECAR_BODY_RATE_GRACE_MS="200",
    )
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    async with asyncio.timeout(5):
        answer = await exchange(server.proxy_port, head + b" " * 60_000, timeout_s=5)
    assert answer.startswith(b"HTTP/1.1 408")
    assert error_of(answer.partition(b"\r\n\r\n")[2])["code"] == "body_timeout"
    samples = await scrape(admin_url(server) + "/metrics")
    assert samples["sidecar_requests_total{outcome=body_timeout}"] == 1


async def test_a_free_paths_stalled_body_is_counted(edge: Start) -> None:
    """A body to a free path (no permit, no request outcome of its own) cut by the pace floor
    still counts as body_timeout."""
    server = await edge(SIDECAR_BODY_MIN_RATE="1000", SIDECAR_BODY_RATE_GRACE_MS="100")
    head = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    answer = await exchange(server.proxy_port, head + b"{", timeout_s=5)
    assert answer.startswith(b"HTTP/1.1 408")
    samples = await scrape(admin_url(server) + "/metrics")
    assert samples["sidecar_requests_total{outcome=body_timeout}"] == 1


async def test_refusals_at_the_door_are_counted(edge: Start) -> None:
    """A refusal at the connection cap and a header timeout each count in
    sidecar_requests_total, under their own outcome, and a burst is logged once."""
    server = await edge(SIDECAR_MAX_CONNECTIONS="1", SIDECAR_HEADER_TIMEOUT_MS="500")
    holder = await connections(server, 1, b"GET /v1/models HTTP/1.1\r\n")
    try:
        assert await until(lambda: _open(server, 1))
        with capture_logs() as logs:
            answers = [
                await exchange(server.proxy_port, b"GET /v1/models HTTP/1.1\r\n\r\n")
                for _ in range(3)
            ]
        async with asyncio.timeout(3):
            assert (await holder[0][0].read()).startswith(b"HTTP/1.1 408")
    finally:
        _reader, writer = holder[0]
        writer.close()
    assert all(answer.startswith(b"HTTP/1.1 503") for answer in answers)
    samples = await scrape(admin_url(server) + "/metrics")
    assert samples["sidecar_requests_total{outcome=too_many_connections}"] == 3
    assert samples["sidecar_requests_total{outcome=header_timeout}"] == 1
    lines = [e for e in logs if e["event"] == "too_many_connections"]
    assert [line.get("repeated") for line in lines] == [0]


async def _held(bodies: BodyBudget, n: int) -> bool:
    return bodies.held == n


async def test_prompt_counting_is_capped_by_the_gate(edge: Start, double: EngineDouble) -> None:
    """With one slot for checking and counting, a second priced request while the engine still
    counts the first one's prompt is refused 503 edge_busy at once."""
    server = await edge(SIDECAR_MAX_PRE_ADMISSION="1", SIDECAR_PROMPT_TOKENS="engine")
    async with aiohttp.ClientSession() as s:
        held = asyncio.create_task(
            s.post(
                proxy_url(server) + "/v1/completions", json=COMPLETION, headers={"x-double": "held"}
            )
        )
        try:
            assert await until(lambda: _gate_held(server, 1))
            async with s.post(proxy_url(server) + "/v1/completions", json=COMPLETION) as r:
                assert r.status == 503
                assert error_of(await r.read())["code"] == "edge_busy"
                assert r.headers["Retry-After"] == "1"
        finally:
            double.released.set()
            (await held).release()
    assert await until(lambda: _gate_held(server, 0))


async def _gate_held(server: SidecarServer, n: int) -> bool:
    return server.gate.held == n


async def test_a_trickled_body_is_cut_at_its_floor_with_a_408(
    edge: Start, double: EngineDouble
) -> None:
    """A byte every 50 ms (20 B/s) under a 1,000 B/s floor is cut once the grace is over, long
    before the 30 s body timeout; nothing reaches the engine."""
    server = await edge(
        SIDECAR_BODY_TIMEOUT_MS="30000",
        SIDECAR_BODY_MIN_RATE="1000",
        SIDECAR_BODY_RATE_GRACE_MS="300",
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n")

    async def trickle() -> None:
        for _ in range(500):
            writer.write(b" ")
            await asyncio.sleep(0.05)

    trickling = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(5):
            answer = await reader.readuntil(b"}}")
    finally:
        trickling.cancel()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408")
    assert b'"body_timeout"' in answer
    assert double.seen == []


async def test_a_body_above_its_floor_is_read_whole(edge: Start, double: EngineDouble) -> None:
    """A body sent in pieces far above the floor (100 B every 10 ms against 100 B/s) is read to
    its end and forwarded."""
    server = await edge(SIDECAR_BODY_MIN_RATE="100", SIDECAR_BODY_RATE_GRACE_MS="200")
    body = json.dumps(COMPLETION).encode() + b" " * 2000  # JSON may end in white space
    reader, writer = await asyncio.open_connection("127.0.0.1", server.proxy_port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    try:
        for start in range(0, len(body), 100):
            writer.write(body[start : start + 100])
            await asyncio.sleep(0.01)
        async with asyncio.timeout(5):
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    finally:
        writer.close()
    assert double.seen == [("POST", "/v1/completions")]


async def test_drain_past_its_grace_ends_streams_in_band(edge: Start) -> None:
    """Grace gone: a running stream gets an SSE error with code draining, then [DONE]."""
    server = await edge()
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            proxy_url(server) + "/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={"x-double": "endless"},
        ) as r,
    ):
        await r.content.readuntil(b"\n\n")
        drained = asyncio.create_task(server.drain(0.2))
        body = await asyncio.wait_for(r.read(), 10)
        assert await asyncio.wait_for(drained, 3) is False
    events = sse_events(body[body.rfind(b"data: {") :])
    assert json.loads(events[0][1])["error"]["code"] == "draining"
    assert events[-1] == (None, "[DONE]")
    assert server.bulkhead.snapshot().in_use == 0
