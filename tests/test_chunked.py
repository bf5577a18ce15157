"""The chunked decoder alone: any chunks, any extensions and trailers, split at any points."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.edge.chunked import ChunkedBody
from sidecar.edge.http1 import MAX_CHUNK_LINE, EngineProtocolError


def encode(payloads: list[bytes], *, extension: bool = False, trailer: bool = False) -> bytes:
    ext = b";name=value" if extension else b""
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in payloads if p)
    return body + b"0\r\n" + (b"X-Trailer: 1\r\n" if trailer else b"") + b"\r\n"


def feed_all(data: bytes, cuts: list[int]) -> tuple[bytes, ChunkedBody]:
    decoder, out, at = ChunkedBody(), [], 0
    for cut in [*sorted(set(cuts)), len(data)]:
        out += decoder.feed(data[at:cut])
        at = cut
    return b"".join(out), decoder


@given(
    payloads=st.lists(st.binary(min_size=0, max_size=300), max_size=12),
    extension=st.booleans(),
    trailer=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=5_000), max_size=10),
)
def test_any_chunks_split_anywhere_decode_to_their_data(
    payloads: list[bytes], extension: bool, trailer: bool, cuts: list[int]
) -> None:
    """Whatever the reads, the data is what was chunked, in order, and the body ends once."""
    data = encode(payloads, extension=extension, trailer=trailer)
    decoded, decoder = feed_all(data, [c for c in cuts if c < len(data)])
    assert decoded == b"".join(payloads)
    assert decoder.done


def test_whole_chunks_in_one_read_come_out_as_they_were_sent() -> None:
    """The fast path: one read of back-to-back events gives one piece per chunk."""
    decoder = ChunkedBody()
    assert decoder.feed(b"5\r\nhello\r\n6\r\n world\r\n") == [b"hello", b" world"]
    assert not decoder.done
    assert decoder.feed(b"0\r\n\r\n") == []
    assert decoder.done


@given(
    payloads=st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=6),
    cut=st.integers(min_value=0, max_value=2_000),
    last=st.booleans(),
    upper=st.booleans(),
)
def test_a_read_of_whole_chunks_is_taken_whole_and_any_other_read_left_to_feed(
    payloads: list[bytes], cut: int, last: bool, upper: bool
) -> None:
    """``whole`` gives the data of a read that is only complete chunks, not the last one;
    a read cut short, or one that holds the last chunk, is left untouched for ``feed``, which
    then decodes it as if ``whole`` had never seen it."""
    framed = [(b"%X" if upper else b"%x") % len(p) + b"\r\n" + p + b"\r\n" for p in payloads]
    data = b"".join(framed) + (b"0\r\n\r\n" if last else b"")
    read = data[:cut] if 0 < cut < len(data) else data
    decoder = ChunkedBody()
    taken = decoder.whole(read)
    whole_reads = list(itertools.accumulate(framed))  # the reads that end at a chunk's end
    if read in whole_reads and not read.endswith(b"\r\n0\r\n\r\n"):
        assert taken == b"".join(payloads[: whole_reads.index(read) + 1])
    else:
        assert taken is None
        expected, fresh = feed_all(read, [])
        assert b"".join(decoder.feed(read)) == expected
        assert decoder.done == fresh.done


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(b"5;ext=1\r\nhello\r\n", id="an-extension"),
        pytest.param(b"0\r\n\r\n", id="the-last-chunk"),
        pytest.param(b" 5\r\nhello\r\n", id="a-space-before-the-size"),
        pytest.param(b"0x5\r\nhello\r\n", id="a-0x-prefix"),
        pytest.param(b"5\r\nhel", id="a-chunk-cut-short"),
    ],
)
def test_whole_leaves_every_other_read_to_the_general_path(read: bytes) -> None:
    assert ChunkedBody().whole(read) is None


def test_a_read_that_ends_as_a_body_ends_is_left_to_feed() -> None:
    """``whole`` leaves a read ending in the last chunk's bytes to ``feed`` without scanning it,
    even where those bytes end a chunk's data instead (as they may); ``feed`` decodes it right."""
    data = b"\r\n0\r\n"  # framed, its chunk ends in b"\r\n0\r\n\r\n"
    read = b"3\r\nabc\r\n5\r\n" + data + b"\r\n"
    decoder = ChunkedBody()
    assert decoder.whole(read) is None
    assert decoder.feed(read) == [b"abc", data]
    assert not decoder.done


def test_whole_reads_only_between_chunks() -> None:
    """Mid-chunk, or with half a size line kept, the general path has the state: not ``whole``."""
    decoder = ChunkedBody()
    assert decoder.feed(b"5\r\nhel") == [b"hel"]
    assert decoder.whole(b"3\r\nabc\r\n") is None
    decoder = ChunkedBody()
    assert decoder.feed(b"5") == []
    assert decoder.whole(b"\r\nhello\r\n") is None


@pytest.mark.parametrize("spelling", [b"%x", b"%X", b"0%x"], ids=["lower", "upper", "zero-led"])
def test_one_chunk_of_any_size_is_taken_whole_however_its_size_is_spelled(spelling: bytes) -> None:
    """Every size from 1 to 5,000 (past the 3-digit sizes ``whole`` checks by its table), with
    CRLFs in the data: one read of one chunk gives its data; the last chunk gives nothing."""
    for size in range(5_001):
        data = bytes(range(256)) * (size // 256) + b"\r\n" * (size % 256 // 2) + b"x" * (size % 2)
        read = spelling % size + b"\r\n" + data + b"\r\n"
        assert ChunkedBody().whole(read) == (data if size else None), size


def test_a_size_line_that_disagrees_with_the_read_is_not_taken_on_its_length() -> None:
    """A read as long as one 5-byte chunk whose line says 3: an error, as the general path says."""
    with pytest.raises(EngineProtocolError):
        ChunkedBody().whole(b"3\r\nabcde\r\n")


def test_a_whole_chunk_that_overruns_its_size_is_an_error() -> None:
    with pytest.raises(EngineProtocolError):
        ChunkedBody().whole(b"3\r\nhelloXX")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"zz\r\nhello\r\n", id="not-hex"),
        pytest.param(b"5\r\nhelloXX0\r\n\r\n", id="data-overruns-its-size"),
        pytest.param(b"0\r\n\r\nHTTP/1.1 200 OK\r\n", id="bytes-after-the-end"),
        pytest.param(b"1" * 40 + b"\r\n", id="size-past-16-hex-digits"),
        pytest.param(b"5;" + b"x" * (MAX_CHUNK_LINE + 1), id="overlong-line"),
    ],
)
def test_broken_chunking_is_an_error(data: bytes) -> None:
    """A broken body is an EngineProtocolError, never data passed on."""
    with pytest.raises(EngineProtocolError):
        ChunkedBody().feed(data)


def test_bytes_fed_after_the_end_are_an_error() -> None:
    decoder = ChunkedBody()
    decoder.feed(b"0\r\n\r\n")
    with pytest.raises(EngineProtocolError):
        decoder.feed(b"x")
