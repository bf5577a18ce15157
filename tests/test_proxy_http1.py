"""HTTP/1.x on the proxy port as a client sees it over raw sockets: keep-alive, pipelining,
deadlines between requests, framing of its own answers, request bodies and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

from tests.engine_double import EngineDouble, double, numbered_events
from tests.servers import connected, until
from tests.test_edge_functional import CHAT, Start, _open, edge, exchange

__all__ = ["double", "edge"]

COMPLETION = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 5}).encode()


def request(method: str, path: str, body: bytes = b"", *extra: str, version: str = "1.1") -> bytes:
    """One request's bytes: Host, the extra field lines, and JSON framing for a POST."""
    lines = [f"{method} {path} HTTP/{version}", "Host: x", *extra]
    if method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def fields_of(head: bytes) -> dict[str, str]:
    """A head's fields, names lower-cased (the status line left out)."""
    lines = head.decode("latin-1").split("\r\n")[1:]
    pairs = (line.partition(":") for line in lines)
    return {name.strip().lower(): value.strip() for name, _, value in pairs}


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One whole answer off a connection: its head (without the blank line) and its body, as
    its framing says (chunked, Content-Length, or up to the close)."""
    head = (await reader.readuntil(b"\r\n\r\n"))[:-4]
    fields = fields_of(head)
    if "chunked" in fields.get("transfer-encoding", "").lower():
        body = bytearray()
        while size := int((await reader.readline()).split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        assert await reader.readline() == b"\r\n"  # no trailer fields
        return head, bytes(body)
    if "content-length" in fields:
        return head, await reader.readexactly(int(fields["content-length"]))
    return head, await reader.read()


async def until_eof(port: int, data: bytes, timeout_s: float = 3.0) -> bytes:
    """Send raw bytes and read everything up to the server's close (a hang fails in time)."""
    async with connected(port, timeout_s) as (reader, writer):
        writer.write(data)
        return await reader.read()


def error_code(body: bytes) -> str:
    code: str = json.loads(body)["error"]["code"]
    return code


async def test_two_requests_on_one_connection_get_two_answers(
    edge: Start, double: EngineDouble
) -> None:
    """A kept-alive client gets its models list, then its completion, on the same socket."""
    server = await edge()
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(request("GET", "/v1/models"))
        first_head, first = await read_answer(reader)
        writer.write(request("POST", "/v1/completions", COMPLETION))
        second_head, second = await read_answer(reader)
    assert first_head.startswith(b"HTTP/1.1 200")
    assert json.loads(first)  # the whole first body, read before the second request went out
    assert second_head.startswith(b"HTTP/1.1 200")
    assert json.loads(second)["object"] == "text_completion"
    assert double.seen == [("GET", "/v1/models"), ("POST", "/v1/completions")]


async def test_pipelined_requests_are_answered_in_order(edge: Start, double: EngineDouble) -> None:
    """Two requests in one write: the token count comes back first, then the completion."""
    server = await edge()
    tokenize = request("POST", "/tokenize", json.dumps({"prompt": "hi"}).encode())
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(tokenize + request("POST", "/v1/completions", COMPLETION))
        first_head, first = await read_answer(reader)
        second_head, second = await read_answer(reader)
    assert (first_head[:12], json.loads(first)) == (b"HTTP/1.1 200", {"count": 3})
    assert second_head.startswith(b"HTTP/1.1 200")
    assert json.loads(second)["object"] == "text_completion"
    assert double.seen == [("POST", "/tokenize"), ("POST", "/v1/completions")]


async def test_a_slow_second_head_gets_a_408(edge: Start) -> None:
    """Slowloris after a good first exchange: a JSON 408 at the header deadline, then EOF."""
    server = await edge(SIDECAR_HEADER_TIMEOUT_MS="300", SIDECAR_KEEPALIVE_TIMEOUT_MS="5000")
    async with connected(server.proxy_port, timeout_s=3) as (reader, writer):
        writer.write(request("GET", "/v1/models"))
        await read_answer(reader)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        answer = await reader.read()
    assert answer.startswith(b"HTTP/1.1 408")
    assert b'"header_timeout"' in answer


async def test_an_idle_kept_alive_connection_is_closed_quietly(edge: Start) -> None:
    """Nothing sent after an answer: the client reads a plain EOF, and the slot is given back."""
    server = await edge(SIDECAR_KEEPALIVE_TIMEOUT_MS="300")
    async with connected(server.proxy_port, timeout_s=3) as (reader, writer):
        writer.write(request("GET", "/v1/models"))
        await read_answer(reader)
        assert await reader.read() == b""
    assert await until(lambda: _open(server, 0))


async def test_a_malformed_head_gets_an_http11_json_400_and_a_close(edge: Start) -> None:
    """A field line without a colon: an HTTP/1.1 400 in JSON that says it closes, then EOF."""
    server = await edge()
    answer = await until_eof(server.proxy_port, b"GET /v1/models HTTP/1.1\r\nBad Header\r\n\r\n")
    head, _, _ = answer.partition(b"\r\n\r\n")
    fields = fields_of(head)
    assert head.startswith(b"HTTP/1.1 400")
    assert fields["content-type"].startswith("application/json")
    assert fields.get("connection", "").lower() == "close"


async def test_an_http10_client_gets_a_raw_stream_ended_by_the_close(edge: Start) -> None:
    """HTTP/1.0 cannot read chunks: the SSE events come unframed, and the close ends them."""
    server = await edge()
    body = json.dumps({**CHAT, "stream": True}).encode()
    raw = request("POST", "/v1/chat/completions", body, "x-double: paced", version="1.0")
    answer = await until_eof(server.proxy_port, raw)
    head, _, events = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")  # a server sends its own version (RFC 9110 6.2)
    assert "chunked" not in fields_of(head).get("transfer-encoding", "").lower()
    assert events == b"".join(numbered_events(20))  # every event, and no chunk framing at all


async def _keep_sending(writer: asyncio.StreamWriter, pieces: int, piece: bytes) -> None:
    """Write on whatever the server does; a failed write ends the sending, not the test."""
    with contextlib.suppress(ConnectionError):
        for _ in range(pieces):
            writer.write(piece)
            await writer.drain()


async def test_a_too_large_body_still_reads_its_413(edge: Start, double: EngineDouble) -> None:
    """A client that keeps sending a 2 MB body reads its whole 413, not a connection reset."""
    server = await edge(SIDECAR_MAX_BODY_BYTES="1000")
    piece = b"x" * 65_536
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (
        32 * len(piece)
    )
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(head)
        sending = asyncio.create_task(_keep_sending(writer, 32, piece))
        try:
            answer_head, body = await read_answer(reader)
        finally:
            sending.cancel()
            await asyncio.wait([sending])
    assert answer_head.startswith(b"HTTP/1.1 413")
    assert error_code(body) == "body_too_large"
    assert double.seen == []


async def test_an_h2c_upgrade_is_ignored(edge: Start) -> None:
    """A GET offering h2c gets an ordinary HTTP/1.1 200, never a 101 Switching Protocols."""
    server = await edge()
    upgrade = ("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQ")
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(request("GET", "/v1/models", b"", *upgrade))
        head, body = await read_answer(reader)
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)


async def test_an_upgrade_with_a_body_is_refused(edge: Start, double: EngineDouble) -> None:
    """A POST asking to switch protocols while carrying a body gets a JSON 4xx, sent nowhere."""
    server = await edge()
    raw = request("POST", "/v1/completions", COMPLETION, "Connection: Upgrade", "Upgrade: h2c")
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(raw)
        head, body = await read_answer(reader)
    assert head.startswith(b"HTTP/1.1 4")
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert double.seen == []


async def test_shutdown_closes_an_idle_kept_alive_connection(edge: Start) -> None:
    """Stopping with an idle client connected: the stop is prompt and the client reads EOF."""
    server = await edge()
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(request("GET", "/v1/models"))
        await read_answer(reader)
        async with asyncio.timeout(2):
            await server.stop()
        async with asyncio.timeout(1):
            assert await reader.read() == b""


async def test_a_long_request_line_gets_a_json_4xx_that_echoes_nothing(
    edge: Start, double: EngineDouble
) -> None:
    """A 10 kB path is refused in JSON without quoting it back, and the engine sees nothing."""
    server = await edge()
    path = "/v1/models/secret-" + "a" * 10_000
    answer = await exchange(server.proxy_port, request("GET", path))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ", 2)[:2] in ([b"HTTP/1.1", b"400"], [b"HTTP/1.1", b"431"])
    assert fields_of(head)["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert b"secret-" not in answer
    assert double.seen == []


async def test_too_many_header_fields_get_a_json_400_and_reach_no_engine(
    edge: Start, double: EngineDouble
) -> None:
    """64 fields (EdgeLimits.max_headers) pass; a 65th is refused, and the engine sees nothing."""
    server = await edge()
    fields = [f"X-Field-{n}: {n}" for n in range(63)]  # with Host: 64
    answer = await exchange(server.proxy_port, request("GET", "/v1/models", b"", *fields))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
    assert len(double.seen) == 1
    fields.append("X-Field-63: 63")
    answer = await exchange(server.proxy_port, request("GET", "/v1/models", b"", *fields))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert len(double.seen) == 1


async def test_an_overlong_header_field_gets_a_json_400_that_echoes_nothing(
    edge: Start, double: EngineDouble
) -> None:
    """A field over EdgeLimits.max_field_size (8,190 bytes, name and value) is refused."""
    server = await edge()
    value = "secret-" + "a" * 8_200
    answer = await exchange(server.proxy_port, request("GET", "/v1/models", b"", f"X-Big: {value}"))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert b"secret-" not in answer
    assert double.seen == []


async def test_the_sidecars_own_answers_carry_a_date(edge: Start) -> None:
    """A 400 the sidecar writes itself, for a body that is not JSON, says when it was sent."""
    server = await edge()
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(request("POST", "/v1/completions", b"{not json"))
        head, body = await read_answer(reader)
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert fields_of(head)["date"].endswith(" GMT")


async def test_a_chunked_body_is_read_whole_and_forwarded(
    edge: Start, double: EngineDouble
) -> None:
    """A completion sent in three chunks is checked and answered by the engine like any other."""
    server = await edge()
    parts = [COMPLETION[:5], COMPLETION[5:20], COMPLETION[20:]]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(head + chunks)
        answer_head, body = await read_answer(reader)
    assert answer_head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["object"] == "text_completion"
    assert double.seen == [("POST", "/v1/completions")]


async def test_client_sockets_send_at_once(edge: Start) -> None:
    """Nagle is off on every client connection: a head sent alone never holds back the first
    event for the client's delayed ACK (a 40 ms stall per stream on a kept-alive connection)."""
    server = await edge()
    proxy = server.proxy_server
    assert proxy is not None
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(request("GET", "/v1/models"))
        await read_answer(reader)
        sockets = [c.transport.get_extra_info("socket") for c in proxy.connections if c.transport]
    assert len(sockets) == 1
    assert sockets[0].getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


async def test_an_http10_keep_alive_client_keeps_its_connection(edge: Start) -> None:
    """HTTP/1.0 with `Connection: keep-alive`: a whole completion, sized, that says keep-alive,
    then a second one on the same connection."""
    server = await edge()
    ask = request("POST", "/v1/completions", COMPLETION, "Connection: keep-alive", version="1.0")
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(ask)
        first_head, first = await read_answer(reader)
        writer.write(ask)
        second_head, _second = await read_answer(reader)
    assert fields_of(first_head)["connection"].lower() == "keep-alive"
    assert "content-length" in fields_of(first_head)
    assert json.loads(first)["object"] == "text_completion"
    assert second_head.startswith(b"HTTP/1.1 200")


async def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent(
    edge: Start, double: EngineDouble
) -> None:
    """`Expect: 100-continue` with a Content-Length over the limit: a 413 at once, no 100
    Continue, so the client never uploads the body."""
    server = await edge(SIDECAR_MAX_BODY_BYTES="1000")
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: 10000000\r\n\r\n"
    )
    async with connected(server.proxy_port) as (reader, writer):
        writer.write(head)
        answer_head, body = await read_answer(reader)
    assert answer_head.startswith(b"HTTP/1.1 413")
    assert error_code(body) == "body_too_large"
    assert double.seen == []
