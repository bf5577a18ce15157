"""The heads we write: the engine's request and the client's answer, byte for byte, and never one
that a CR, LF or NUL in a field would split into two."""

from __future__ import annotations

import json

import pytest
from multidict import CIMultiDict

from sidecar.core.outcomes import EdgeFault
from sidecar.edge.engine.errors import UnsendableRequestError
from sidecar.edge.engine.http1 import encode_request
from sidecar.edge.http.response import response_head
from sidecar.edge.message import UnsendableHeadError, raw_answer

BAD_FIELDS = [
    pytest.param("X-A", "1\r\nX-Smuggled: 2", id="crlf-in-a-value"),
    pytest.param("X-A", "1\nX-Smuggled: 2", id="lf-in-a-value"),
    pytest.param("X-A", "1\rX-Smuggled: 2", id="cr-in-a-value"),
    pytest.param("X-A\r\nX-Smuggled", "2", id="crlf-in-a-name"),
]


def test_a_request_head_is_its_line_host_fields_and_length_in_order() -> None:
    """Fields as a CIMultiDict holds them (istr names), Host and framing ours, body after."""
    headers = CIMultiDict([("Content-Type", "application/json"), ("Host", "client.example")])
    headers["X-Request-Id"] = "r1"
    encoded = encode_request("POST", "/v1/completions", "engine:8000", headers, b"{}")
    assert encoded == (
        b"POST /v1/completions HTTP/1.1\r\nHost: engine:8000\r\n"
        b"Content-Type: application/json\r\nX-Request-Id: r1\r\nContent-Length: 2\r\n\r\n{}"
    )


@pytest.mark.parametrize(("name", "value"), BAD_FIELDS)
def test_a_request_field_with_a_line_break_is_refused(name: str, value: str) -> None:
    with pytest.raises(UnsendableRequestError, match="line break"):
        encode_request("GET", "/v1/models", "engine", CIMultiDict([(name, value)]), None)


@pytest.mark.parametrize(
    ("target", "value"),
    [
        pytest.param("/v1/models", "a\x00b", id="nul-in-a-value"),
        pytest.param("/v1/models HTTP/1.0", "ok", id="space-in-the-target"),
    ],
)
def test_a_request_with_a_forbidden_character_is_refused(target: str, value: str) -> None:
    with pytest.raises(UnsendableRequestError, match="forbidden character"):
        encode_request("GET", target, "engine", CIMultiDict([("X-A", value)]), None)


def test_a_response_head_is_its_status_fields_and_extras_then_a_blank_line() -> None:
    """Framing fields are left to ``extra`` (the engine's own dropped); a Date given is kept."""
    fields = CIMultiDict([("Content-Type", "text/event-stream"), ("Connection", "keep-alive")])
    fields["Date"] = "Tue, 01 Dec 2026 00:00:00 GMT"
    head = response_head(200, "OK", fields, ["Transfer-Encoding: chunked"], close=True)
    assert head == (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Date: Tue, 01 Dec 2026 00:00:00 GMT\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n"
    )


@pytest.mark.parametrize(("name", "value"), BAD_FIELDS)
def test_a_response_field_with_a_line_break_is_refused(name: str, value: str) -> None:
    with pytest.raises(UnsendableHeadError):
        response_head(200, "OK", CIMultiDict([(name, value)]), [], close=False)


def test_a_reason_with_a_line_break_is_refused() -> None:
    """The status line is checked as the fields are."""
    with pytest.raises(UnsendableHeadError):
        response_head(200, "OK\r\nX-Smuggled: 1", CIMultiDict(), [], close=False)


@pytest.mark.parametrize(
    ("fault", "status_line", "retry"),
    [
        pytest.param("too_many_connections", b"503 Service Unavailable", True, id="503-retry"),
        pytest.param("header_timeout", b"408 Request Timeout", False, id="408-no-retry"),
    ],
)
def test_a_door_answer_is_whole_and_closes(
    fault: EdgeFault, status_line: bytes, retry: bool
) -> None:
    """Refused before any handler runs: status, JSON length, close, Retry-After on a 503 only."""
    answer = raw_answer(fault)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n") == [
        b"HTTP/1.1 " + status_line,
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(body),
        b"Connection: close",
        *([b"Retry-After: 1"] if retry else []),
    ]
    assert json.loads(body)["error"]["code"] == fault
