"""HeadCache: an engine's repeated heads parsed once, with the same answer as parsing each."""

from __future__ import annotations

import pytest

from sidecar.edge.http1 import EngineProtocolError, HeadCache, end_to_end, framing, parse_head

STREAM = (
    b"HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 04:14:31 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\nvary: Origin\r\n"
    b"transfer-encoding: chunked"
)  # vLLM 0.32's streamed chat head (../shared/fixtures), without its blank line


def test_a_head_parses_as_parse_head_framing_and_end_to_end_say() -> None:
    parsed = HeadCache().parse(STREAM)
    status, reason, fields, http10 = parse_head(STREAM)
    assert (parsed.status, parsed.reason, dict(parsed.fields), parsed.http10) == (
        status, reason, dict(fields), http10,
    )  # fmt: skip
    assert parsed.framing == framing(status, fields, http10=http10, head_request=False)
    assert parsed.framing == ("chunked", 0, True)
    assert list(parsed.forwarded) == list(end_to_end(fields).items())
    assert "transfer-encoding" not in dict(parsed.forwarded)


def test_a_repeated_head_is_parsed_once_and_shared_read_only() -> None:
    cache = HeadCache()
    first = cache.parse(STREAM)
    assert cache.parse(bytes(STREAM)) is first  # equal bytes, another object: the same head
    with pytest.raises(TypeError):
        first.fields["X-Added"] = "1"  # type: ignore[index]


def test_the_next_second_is_a_new_head() -> None:
    cache = HeadCache()
    first = cache.parse(STREAM)
    later = cache.parse(STREAM.replace(b"04:14:31", b"04:14:32"))
    assert later is not first
    assert later.fields["date"] == "Mon, 30 Nov 2026 04:14:32 GMT"


def test_heads_framed_by_length_are_not_kept() -> None:
    cache = HeadCache()
    for size in range(20):
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d" % size
        assert cache.parse(head).framing == ("length", size, True)
    assert len(cache) == 0


def test_the_cache_holds_at_most_its_size_then_starts_again() -> None:
    cache = HeadCache(size=3)
    heads = [STREAM + b"\r\nx-n: %d" % n for n in range(7)]
    for head in heads:
        cache.parse(head)
        assert 1 <= len(cache) <= 3
    assert cache.parse(heads[-1]) is cache.parse(heads[-1])


def test_a_malformed_head_is_refused_every_time() -> None:
    cache = HeadCache()
    for _ in range(2):
        with pytest.raises(EngineProtocolError):
            cache.parse(b"HTTP/1.1 200 OK\r\nbad header")
    assert len(cache) == 0


def test_fields_the_connection_field_names_are_not_forwarded() -> None:
    head = b"HTTP/1.1 200 OK\r\nConnection: X-Hop\r\nX-Hop: 1\r\nX-Kept: 2\r\nContent-Length: 0"
    assert HeadCache().parse(head).forwarded == (("X-Kept", "2"),)
