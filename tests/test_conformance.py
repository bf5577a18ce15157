"""The head rules of sidecar.edge.conformance, one case each (the functional tests run them
over sockets)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from sidecar.edge.conformance import HeadRefusedError, check_head, without_fragment


def fields(*pairs: tuple[str, str]) -> CIMultiDict[str]:
    return CIMultiDict(pairs)


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("example.com", id="name"),
        pytest.param("example.com:8080", id="name-port"),
        pytest.param("10.0.0.1:80", id="ipv4-port"),
        pytest.param("[::1]:8080", id="ipv6-port"),
        pytest.param("", id="empty"),  # RFC 9110 §7.2: a target without authority
        pytest.param("my%20host", id="pct-encoded"),
    ],
)
def test_a_valid_host_passes(host: str) -> None:
    """Every uri-host [":" port] spelling RFC 3986 allows is taken."""
    head = check_head("1.1", "/", fields(("Host", host)), keep_alive=True, upgrade=False)
    assert head.keep_alive


@pytest.mark.parametrize(
    ("version", "pairs", "message"),
    [
        pytest.param("1.1", [], "without a Host", id="1.1-no-host"),
        pytest.param("1.0", [("Host", "a"), ("Host", "a")], "more than one", id="two"),
        pytest.param("1.1", [("Host", "a b")], "not a host", id="space"),
        pytest.param("1.1", [("Host", "a:b")], "not a host", id="bad-port"),
        pytest.param("1.1", [("Host", "[::1")], "not a host", id="open-bracket"),
        pytest.param("2.0", [("Host", "a")], "HTTP/1.0 and HTTP/1.1", id="http-2"),
        pytest.param(
            "1.1",
            [("Host", "a"), ("Transfer-Encoding", "gzip, chunked")],
            "other than chunked",
            id="gzip-chunked",
        ),
    ],
)
def test_a_broken_rule_is_refused_by_name(
    version: str, pairs: list[tuple[str, str]], message: str
) -> None:
    """Each rule refuses with its own message (our words, no client bytes)."""
    with pytest.raises(HeadRefusedError, match=message):
        check_head(version, "/", fields(*pairs), keep_alive=True, upgrade=False)


@pytest.mark.parametrize(
    ("version", "keeps"),
    [pytest.param("1.0", False, id="http-1.0-closes"), pytest.param("1.1", True, id="http-1.1")],
)
def test_chunked_keeps_the_connection_only_on_http_1_1(version: str, *, keeps: bool) -> None:
    """RFC 9112 §6.1: Transfer-Encoding on HTTP/1.0 means faulty framing, so the connection
    closes after the answer, whatever the client asked."""
    pairs = fields(("Host", "a"), ("Transfer-Encoding", "chunked"))
    head = check_head(version, "/", pairs, keep_alive=True, upgrade=False)
    assert (head.body_exists, head.keep_alive) == (True, keeps)


@pytest.mark.parametrize(
    ("url", "target"),
    [
        pytest.param("/a?b#c", "/a?b", id="after-query"),
        pytest.param("/a#c?b", "/a", id="before-query"),
        pytest.param("/a#", "/a", id="empty-fragment"),
        pytest.param("/a?b", "/a?b", id="none"),
    ],
)
def test_the_fragment_is_dropped(url: str, target: str) -> None:
    """Everything from the first '#' goes (RFC 3986 §3.5)."""
    assert without_fragment(url) == target
