"""Hypothesis against the proxy port's own HTTP/1.1 server: hostile raw bytes, pipelined and cut
anywhere, never get a 500 nor an HTTP/1.0 status line, and leak no connection and no permit.

The sidecar runs on a loop in a background thread for the whole module, with short deadlines so
that every connection it keeps alive ends quickly; each example is one blocking socket.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import itertools
import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble
from tests.servers import sidecar_in_a_thread
from tests.test_fuzz_edge import Live

FAST = {
    "SIDECAR_MAX_QUEUE": "8",
    "SIDECAR_KEEPALIVE_TIMEOUT_MS": "100",
    "SIDECAR_HEADER_TIMEOUT_MS": "500",
    "SIDECAR_BODY_TIMEOUT_MS": "500",
}
READ_TIMEOUT_S = 3.0  # silence past every deadline above (and the server's 1 s linger): a hang
BODY = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 5}).encode()
ANSWER = {"object": "text_completion", "choices": [{"text": "hi"}], "data": [], "count": 3}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
STATUS_LINE = re.compile(rb"HTTP/(\d\.\d) (\d{3}) ")


@dataclass
class Wired(Live):
    """The live sidecar, and what reached its loop's exception handler (a protocol crash)."""

    crashes: list[dict[str, Any]] = field(default_factory=list)


def build_engine(double: EngineDouble) -> web.Application:
    """An engine that answers anything that reaches it with a 200: any 500 is the sidecar's."""

    async def handle(request: web.Request) -> web.Response:
        double.seen.append((request.method, request.raw_path))
        await request.read()
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@pytest.fixture(scope="module")
def live() -> Iterator[Wired]:
    """A sidecar with short deadlines in front of a never-failing engine, on its own loop."""
    loop = asyncio.new_event_loop()
    crashes: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: crashes.append(context))
    double = EngineDouble()
    with sidecar_in_a_thread(lambda: build_engine(double), FAST, loop) as server:
        yield Wired(server, double, loop, crashes)


Head = tuple[list[bytes], bytes]  # the request line and field lines, and the framed body
MODELS: Head = [b"GET /v1/models HTTP/1.1", b"Host: x", b"Connection: close"], b""


def encode(request: Head) -> bytes:
    """A request's bytes on the wire."""
    return b"\r\n".join(request[0]) + b"\r\n\r\n" + request[1]


def cut(data: bytes, points: list[int]) -> list[bytes]:
    """``data`` in pieces, cut at ``points`` (modulo its length); never an empty piece."""
    bounds = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def valid(draw: st.DrawFn) -> Head:
    """GET /v1/models, a completion framed by length or chunked, or a free /tokenize."""
    kind = draw(st.sampled_from(["models", "length", "chunked", "tokenize"]))
    if kind == "models":
        return MODELS[0][:2], b""
    path = b"/tokenize" if kind == "tokenize" else b"/v1/completions"
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: x", b"Content-Type: application/json"]
    if kind != "chunked":
        return [*lines, b"Content-Length: %d" % len(BODY)], BODY
    parts = cut(BODY, draw(st.lists(st.integers(1, len(BODY) - 1), max_size=3)))
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(part), part) for part in parts)
    return [*lines, b"Transfer-Encoding: chunked"], chunks + b"0\r\n\r\n"


HOSTILE = {
    b"Content-Length": [b"0", b"-1", b"+5", b" 5", b"5, 5", b"5,6", b"0x10", b"", b"1e3",
                        b"99999999999999999999", b"4194305", b"100", b"\xff"],
    b"Transfer-Encoding": [b"chunked", b"chunked, chunked", b"gzip", b"gzip, chunked",
                           b"chunked, gzip", b"xchunked", b"identity", b"\tchunked", b"CHUNKED"],
    b"Expect": [b"100-continue", b"100-Continue", b"200-ok", b""],
    b"Connection": [b"close", b"keep-alive", b"upgrade", b"Upgrade, close", b"keep-alive, close",
                    b"TE, Content-Length", b"\xff"],
    b"Upgrade": [b"websocket", b"h2c", b"HTTP/2.0", b"TLS/1.0", b""],
    b"Host": [b"", b"a b", b"x:99999"],
}  # fmt: skip
FIELDS = st.sampled_from(sorted(HOSTILE)).flatmap(
    lambda name: st.sampled_from(HOSTILE[name]).map(lambda value: name + b": " + value)
)
VERSIONS = st.sampled_from(
    [
        b"HTTP/1.0",
        b"HTTP/2.0",
        b"HTTP/0.9",
        b"HTTP/1.2",
        b"HTTP/1",
        b"http/1.1",
        b"HTTP/1.1 ",
        b"HTTP/11",
        b"",
    ]
)
BYTES = st.sampled_from(
    [b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b"\x00", b"\x7f", b"\xff", b";", b","]
) | st.binary(min_size=1, max_size=3)
NEWLINES = st.sampled_from([b"", b"\r\n\r\n", b"\n", b"\r", b"\r\n ", b"\n\r"])


def mutate(draw: st.DrawFn, head: bytes) -> bytes:
    """One edit: a CRLF removed, doubled or bent, or bytes inserted, deleted or replaced."""
    crlfs = [match.start() for match in re.finditer(rb"\r\n", head)]
    if draw(st.booleans()) and crlfs:
        at = draw(st.sampled_from(crlfs))
        return head[:at] + draw(NEWLINES) + head[at + 2 :]
    at = draw(st.integers(0, len(head) - 1))
    return head[:at] + draw(st.just(b"") | BYTES) + head[at + draw(st.integers(0, 1)) :]


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    """A valid request with another version, its framing field swapped for hostile ones, and up
    to three byte edits."""
    lines, body = draw(valid())
    if draw(st.booleans()):
        lines = [line for line in lines if not line.startswith((b"Content-L", b"Transfer-E"))]
    if draw(st.booleans()):
        lines[0] = lines[0].rsplit(b" ", 1)[0] + b" " + draw(VERSIONS)
    lines = [*lines, *draw(st.lists(FIELDS, max_size=3))]
    head = encode((lines, b""))
    for _ in range(draw(st.integers(0, 3))):
        head = mutate(draw, head)
    return head + body


def exchange(port: int, pieces: list[bytes], *, half_close: bool) -> tuple[bytes, str]:
    """Send the pieces one by one, maybe half-close, then read: the reply and how it ended."""
    reply = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            for piece in pieces:
                sock.sendall(piece)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the sidecar refused and closed already: what it said is still to be read
        sock.settimeout(READ_TIMEOUT_S)
        try:
            while data := sock.recv(65536):
                reply += data
        except OSError as exc:  # TimeoutError: a hang; ConnectionResetError: the answer lost
            return bytes(reply), type(exc).__name__
    return bytes(reply), "EOF"


class _Replay(io.BytesIO):
    """The reply as http.client's socket: every answer read off one stream, never closed."""

    def makefile(self, *_args: object) -> io.BytesIO:
        return self

    def close(self) -> None:
        pass


def answers(reply: bytes) -> list[tuple[int, int, str, bytes]]:
    """Each answer in the reply, by its own framing: version, status, content type, body."""
    stream, out = _Replay(reply), []
    while stream.tell() < len(reply):
        if reply.startswith(CONTINUE, stream.tell()):  # its final answer may never come: a
            stream.seek(len(CONTINUE), io.SEEK_CUR)  # half-close ends the request it waited for
            continue
        answer = http.client.HTTPResponse(stream)  # type: ignore[arg-type]
        answer.begin()
        out.append(
            (answer.version, answer.status, answer.getheader("Content-Type", ""), answer.read())
        )
    return out


async def _settled(server: SidecarServer) -> tuple[int, int, int]:
    """Open connections, permits in use and queued: polled until all are 0, for up to 5 s."""
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        snapshot, count = server.bulkhead.snapshot(), server.proxy_connections
        held = (count.open if count else -1, snapshot.in_use, snapshot.queued)
        if held == (0, 0, 0) or asyncio.get_running_loop().time() > deadline:
            return held
        await asyncio.sleep(0.01)


def check(live: Wired, data: bytes, points: list[int], *, half_close: bool) -> list[int]:
    """One exchange of ``data`` cut at ``points``, then every assertion; the statuses."""
    with capture_logs() as logs:
        reply, ending = exchange(live.server.proxy_port, cut(data, points), half_close=half_close)
        held = asyncio.run_coroutine_threadsafe(_settled(live.server), live.loop).result(10)
    sent = f"sent {data!r} cut at {points} (half-close: {half_close}); got {reply!r}"
    assert ending == "EOF", sent
    for version, status in STATUS_LINE.findall(reply):  # 100 Continue too
        assert (version, status != b"500") == (b"1.1", True), sent
    try:
        parsed = answers(reply)
    except http.client.HTTPException as exc:
        raise AssertionError(f"not a run of whole HTTP/1.1 answers: {exc!r}; {sent}") from exc
    for version, status, content_type, body in parsed:
        assert (version, status != 500) == (11, True), sent
        if 400 <= status < 500 and content_type.startswith("application/json"):
            assert isinstance(json.loads(body)["error"]["type"], str), sent
    assert held == (0, 0, 0), f"connections, permits, queued still held: {held}; {sent}"
    assert live.double.generating() <= live.server.bulkhead.snapshot().granted_total, sent
    assert [e for e in logs if e["log_level"] in {"error", "critical"}] == [], sent
    assert live.crashes == [], sent
    final, _ = exchange(live.server.proxy_port, [encode(MODELS)], half_close=False)
    assert final.startswith(b"HTTP/1.1 200 "), final
    return [status for _, status, _, _ in parsed]


FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
POINTS = st.lists(st.integers(0, 4096), max_size=4)


@settings(FUZZ, max_examples=100)
@given(
    requests=st.lists(valid().map(encode) | hostile(), min_size=1, max_size=3),
    points=POINTS,
    half_close=st.booleans(),
)
def test_hostile_bytes_never_get_a_500_nor_leak(
    live: Wired, requests: list[bytes], points: list[int], half_close: bool
) -> None:
    """Mutated heads, smuggling fields, odd versions, pipelined and cut anywhere: only whole
    HTTP/1.1 answers, no 500, JSON errors, the connection and its permit given back."""
    check(live, b"".join(requests), points, half_close=half_close)


@settings(FUZZ, max_examples=50)
@given(requests=st.lists(valid(), min_size=1, max_size=3), points=POINTS)
def test_valid_requests_pipelined_and_cut_anywhere_all_get_a_200(
    live: Wired, requests: list[Head], points: list[int]
) -> None:
    """However the byte stream is cut, the first two requests get their 200s, in order; a third
    read ahead of the client's reads may find the connection closed (RFC 9112 §9.3.2)."""
    data = b"".join(map(encode, requests))
    statuses = check(live, data, points, half_close=False)
    assert statuses == [200] * len(statuses)
    assert len(statuses) >= min(2, len(requests))
