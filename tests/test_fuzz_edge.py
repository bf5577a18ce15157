"""Hypothesis against a live sidecar: hostile bodies, paths and headers never get a 500, never
reach the engine without a permit, and never leak one.

The sidecar and a recording engine double run on their own event loop in a thread for the whole
module; each example is one blocking HTTP exchange over a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.entry.app import SidecarServer
from sidecar.limiter.events import BulkheadSnapshot
from tests.engine_double import EngineDouble, build_double
from tests.servers import sidecar_in_a_thread


@dataclass
class Live:
    server: SidecarServer
    double: EngineDouble
    loop: asyncio.AbstractEventLoop

    def exchange(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.proxy_port, timeout=10)
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in {"Host": "x", **headers, "Content-Length": str(len(body))}.items():
                connection.putheader(name, value)
            connection.endheaders(body)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    """A sidecar in front of the double, on a loop in a background thread."""
    loop = asyncio.new_event_loop()
    double = EngineDouble()
    env = {"SIDECAR_MAX_QUEUE": "8"}
    with sidecar_in_a_thread(lambda: build_double(double), env, loop) as server:
        yield Live(server, double, loop)


def check(live: Live, status: int) -> None:
    """After each exchange: no 5xx at all (the engine double never fails, so a 502, 503 or 504
    here is the sidecar's bug), nothing generating got past without a grant, none held."""
    assert status < 500, status
    assert live.double.generating() <= live.server.bulkhead.snapshot().granted_total
    # The permit is given back just after the last byte went out: wait (bounded) for it.
    idle = asyncio.run_coroutine_threadsafe(_idle(live.server), live.loop).result(5)
    assert idle.in_use == 0
    assert idle.queued == 0


async def _idle(server: SidecarServer) -> BulkheadSnapshot:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.bulkhead.idle(), 2)
    return server.bulkhead.snapshot()


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "model": JSONISH,
        "stream": JSONISH,
        "n": JSONISH,
        "max_tokens": JSONISH,
        "max_completion_tokens": JSONISH,
        "max_output_tokens": JSONISH,
        "prompt": JSONISH,
        "messages": JSONISH
        | st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": JSONISH}), max_size=3
        ),
        "input": JSONISH,
        "instructions": JSONISH,
    },
)
HOSTILE_BYTES = st.sampled_from(
    [
        b'{"prompt": "\\ud800", "max_tokens": 2}',
        b'{"prompt": "hi", "max_tokens": ' + b"7" * 5000 + b"}",
        b"[" * 50_000,
        b'{"messages": [{"content": [{"text": 1}]}]}',
        '{"prompt": "hi"}'.encode("utf-16"),
        b"\xef\xbb\xbf{}",
        b"",
        b"null",
        b'{"max_tokens": NaN, "prompt": "x"}',
    ]
)
BODIES = FIELDS.map(lambda d: json.dumps(d).encode()) | HOSTILE_BYTES | st.binary(max_size=64)
ENDPOINTS = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses"])
SEGMENT = st.sampled_from(
    [
        "v1",
        "chat",
        "completions",
        "responses",
        ".",
        "..",
        "",
        "%2E",
        "%2e",
        "%2F",
        "%5C",
        "%41",
        "%",
        "x",
        "tokenize",
        "%252E",
    ]
)
PATHS = st.lists(SEGMENT, min_size=1, max_size=6).map(lambda parts: "/" + "/".join(parts))
HEADER_VALUES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
HEADERS = st.dictionaries(
    st.sampled_from(
        [
            "Content-Type",
            "X-Tenant-Id",
            "X-Priority",
            "Authorization",
            "X-Request-Id",
            "Accept",
            "Content-Encoding",
        ]
    ),
    HEADER_VALUES,
    max_size=4,
)
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(body=BODIES, path=ENDPOINTS)
def test_hostile_bodies_never_get_a_500_nor_a_free_ride(live: Live, body: bytes, path: str) -> None:
    """Any structure, type, surrogate, huge number or nesting: the engine's 200, or a 4xx whose
    body is an OpenAI error naming what was wrong."""
    status, answer = live.exchange("POST", path, body, {"Content-Type": "application/json"})
    check(live, status)
    if status != 200:
        assert 400 <= status < 500, status
        error = json.loads(answer)["error"]
        assert {"message", "type", "code"} <= error.keys(), error
        assert error["message"], error


@FUZZ
@given(path=PATHS, method=st.sampled_from(["POST", "GET", "PUT", "DELETE"]))
def test_any_path_spelling_is_admitted_or_refused(live: Live, path: str, method: str) -> None:
    """Dot segments, escapes and slashes: whatever reaches the engine held a permit."""
    body = json.dumps({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}).encode()
    check(live, live.exchange(method, path, body, {})[0])


@FUZZ
@given(headers=HEADERS, path=ENDPOINTS)
def test_hostile_headers_never_get_a_500(live: Live, headers: dict[str, str], path: str) -> None:
    """Odd content types, tenants, priorities and keys: never a 500, never a leaked permit."""
    body = json.dumps(
        {"prompt": "hi", "input": "hi", "messages": [{"role": "user", "content": "x"}]}
    )
    check(live, live.exchange("POST", path, body.encode(), headers)[0])
