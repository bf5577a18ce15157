"""RFC 9112's rules on the request head (sidecar.edge.conformance), over real sockets: what is
refused reaches nothing, what is kept reaches the engine as the rule says."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import sidecars

__all__ = ["double"]

Start = Callable[..., Awaitable[SidecarServer]]
COMPLETION = b'{"model":"m","prompt":"hi","max_tokens":5}'


@pytest.fixture
async def edge(double: EngineDouble) -> AsyncIterator[Start]:
    """Start sidecars in front of the recording double; stopped at teardown."""
    async with sidecars(double.url) as start:
        yield start


async def exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes, read everything until the server closes (bounded in time)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        async with asyncio.timeout(5):
            return await reader.read()
    finally:
        writer.close()


def completion(head: bytes) -> bytes:
    """A priced request under ``head`` (request line and fields, without the blank line)."""
    return head + b"Content-Length: %d\r\n\r\n" % len(COMPLETION) + COMPLETION


STATUS_LINE = re.compile(rb"HTTP/1\.1 \d{3} ")
BEHIND = completion(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")


@pytest.mark.parametrize(
    ("head", "rule"),
    [
        pytest.param(b"GET /v1/models HTTP/1.1\r\n", b"without a Host", id="no-host"),
        pytest.param(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nHost: y\r\n", b"more than one", id="two-hosts"
        ),
        pytest.param(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nhost: x\r\n",
            b"more than one",
            id="two-hosts-same-value",
        ),
        pytest.param(b"GET /v1/models HTTP/1.1\r\nHost: a/b\r\n", b"not a host", id="host-path"),
        pytest.param(
            b"GET /v1/models HTTP/1.1\r\nHost: u@x\r\n", b"not a host", id="host-userinfo"
        ),
        pytest.param(
            b"GET /v1/models HTTP/1.0\r\nHost: x\r\nHost: y\r\n",
            b"more than one",
            id="http-1.0-two-hosts",
        ),
    ],
)
async def test_a_head_that_breaks_a_rule_is_a_400_and_nothing_behind_it_runs(
    edge: Start, double: EngineDouble, head: bytes, rule: bytes
) -> None:
    """RFC 9112 §3.2: an HTTP/1.1 head without Host, or any with two, or with a Host that is no
    host, is a JSON 400 naming the rule; the priced request pipelined behind it never runs."""
    server = await edge()
    answer = await exchange(server.proxy_port, head + b"\r\n" + BEHIND)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400")
    assert rule in json.loads(body)["error"]["message"].encode()
    assert len(STATUS_LINE.findall(answer)) == 1
    assert double.seen == []
    assert server.bulkhead.snapshot().granted_total == 0


async def test_http_1_0_may_omit_host(edge: Start, double: EngineDouble) -> None:
    """RFC 9112 §3.2 asks Host of HTTP/1.1 only: an HTTP/1.0 request without it is served."""
    server = await edge()
    answer = await exchange(server.proxy_port, b"GET /v1/models HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200")
    assert double.seen == [("GET", "/v1/models")]


async def test_http_1_0_with_chunked_closes_after_its_answer(
    edge: Start, double: EngineDouble
) -> None:
    """RFC 9112 §6.1: HTTP/1.0 with Transfer-Encoding has faulty framing: its answer says close
    and the connection ends, even with keep-alive asked; the request behind it never runs."""
    server = await edge()
    chunked = (
        b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(COMPLETION), COMPLETION)
    )
    answer = await exchange(server.proxy_port, chunked + BEHIND)
    head = answer.partition(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 200")
    assert b"connection: close" in head
    assert len(STATUS_LINE.findall(answer)) == 1
    assert double.seen == [("POST", "/v1/completions")]
    assert server.bulkhead.snapshot().granted_total == 1


async def test_http_1_0_keep_alive_without_chunked_still_keeps(
    edge: Start, double: EngineDouble
) -> None:
    """The rule above is about Transfer-Encoding only: HTTP/1.0 keep-alive with a Content-Length
    carries the next request."""
    server = await edge()
    first = completion(b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n")
    closing = completion(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n")
    answer = await exchange(server.proxy_port, first + closing)
    assert answer.count(b"HTTP/1.1 200") == 2
    assert double.seen == [("POST", "/v1/completions")] * 2


@pytest.mark.parametrize(
    ("target", "seen", "permits"),
    [
        pytest.param(b"/v1/models?a=1#frag", "/v1/models?a=1", 0, id="after-query"),
        pytest.param(b"/v1/models#frag?a=1", "/v1/models", 0, id="before-query"),
        pytest.param(
            b"/v1/completions#/../../tokenize", "/v1/completions", 1, id="dot-segments-in-fragment"
        ),
        pytest.param(b"/tokenize#x", "/tokenize", 0, id="free-path"),
    ],
)
async def test_a_fragment_is_never_forwarded(
    edge: Start, double: EngineDouble, target: bytes, seen: str, permits: int
) -> None:
    """RFC 9112 §3.2: a fragment is no part of the request-target. It is dropped before routing,
    as uvicorn (vLLM's server) drops it: admitted and forwarded path are the engine's own."""
    server = await edge()
    method = b"GET" if b"models" in target else b"POST"
    head = method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    answer = await exchange(server.proxy_port, completion(head))
    assert answer.startswith(b"HTTP/1.1 200")
    assert double.seen == [(method.decode(), seen)]
    assert server.bulkhead.snapshot().granted_total == permits
