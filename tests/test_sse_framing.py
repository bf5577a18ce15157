"""SSE event framing: LF, CRLF and CR line ends, events split anywhere, linear time."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.edge.proxy.sse_framing import EventFramer, ends_with_done


def frame(chunks: list[bytes]) -> list[bytes]:
    framer = EventFramer()
    return [out for chunk in chunks if (out := framer.feed(chunk))]


@pytest.mark.parametrize(
    ("chunks", "sent"),
    [
        pytest.param([b"data: a\n\n"], [b"data: a\n\n"], id="lf"),
        pytest.param([b"data: a\r\n\r\n"], [b"data: a\r\n\r\n"], id="crlf"),
        pytest.param([b"data: a\r\r"], [b"data: a\r\r"], id="cr"),
        pytest.param([b"data: a\r\n", b"\r\n"], [b"data: a\r\n\r\n"], id="crlf-split-between"),
        pytest.param([b"data: a\r", b"\n\r\n"], [b"data: a\r\n\r\n"], id="crlf-split-inside"),
        pytest.param([b"data: a\r", b"\ndata: b"], [], id="split-crlf-is-one-line-end"),
        pytest.param([b"data: a\n\ndata: b"], [b"data: a\n\n"], id="partial-held"),
        pytest.param([b"data: a\n", b"\n"], [b"data: a\n\n"], id="blank-line-next-chunk"),
        pytest.param([b"data: a\r\n\ndata: b\n\n"], [b"data: a\r\n\ndata: b\n\n"], id="mixed"),
    ],
)
def test_events_end_at_a_blank_line_of_any_line_end(chunks: list[bytes], sent: list[bytes]) -> None:
    """Only whole events go out, whichever line ends the engine uses."""
    assert frame(chunks) == sent


def test_a_partial_event_is_held_until_flush() -> None:
    """Bytes after the last blank line wait; flush hands them over at a clean end."""
    framer = EventFramer()
    assert framer.feed(b"data: a\r\n\r\ndata: b") == b"data: a\r\n\r\n"
    assert framer.flush() == b"data: b"


def test_an_event_that_never_ends_is_not_held_without_bound() -> None:
    """Past the held-bytes bound, the partial event is passed on rather than buffered."""
    framer = EventFramer(max_held=100)
    assert framer.feed(b"x" * 60) == b""
    assert framer.feed(b"y" * 60) == b"x" * 60 + b"y" * 60


def test_many_small_chunks_of_one_long_event_take_linear_time() -> None:
    """20,000 one-line chunks of a CRLF stream with no blank line: no rescan of the buffer."""
    framer = EventFramer(max_held=1 << 30)
    started = time.perf_counter()
    for _ in range(20_000):
        framer.feed(b"data: 0123456789abcdef0123456789abcdef\r\n")
    assert time.perf_counter() - started < 1.0
    assert framer.feed(b"\r\n").endswith(b"\r\n\r\n")


EVENTS = st.lists(st.text("abc:", max_size=5), min_size=1, max_size=6)
EOLS = st.sampled_from([b"\n", b"\r\n", b"\r"])


@given(st.lists(st.tuples(EVENTS, EOLS), min_size=1, max_size=6), st.data())
def test_any_split_of_whole_events_passes_every_byte_in_order(
    events: list[tuple[list[str], bytes]], data: st.DataObject
) -> None:
    """Whole events cut at random points come out complete, byte for byte, nothing held."""
    stream = b"".join(
        b"".join(b"data: " + line.encode() + eol for line in lines) + eol for lines, eol in events
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    framer = EventFramer()
    out = b"".join(framer.feed(piece) for piece in pieces)
    assert out + framer.flush() == stream
    # A blank line ending in a CR is complete at the CR: a LF after it may wait for the next event.
    assert out in (stream, stream[:-1] if stream.endswith(b"\r\n") else stream)


class GeneralFramer(EventFramer):
    """The framer without its LF-only fast path: the reference the fast path must match."""

    __slots__ = ()

    def _last_event_end(self, chunk: bytes) -> int:
        return self._last_any_event_end(chunk)


@given(st.lists(st.sampled_from([b"d", b"\n", b"\n", b"\r"]), max_size=40), st.data())
def test_the_lf_fast_path_cuts_where_the_general_scan_does(
    stream_bytes: list[bytes], data: st.DataObject
) -> None:
    """Any bytes, any split: chunk by chunk, both framers send exactly the same bytes."""
    stream = b"".join(stream_bytes)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    fast, general = EventFramer(), GeneralFramer()
    assert [fast.feed(p) for p in pieces] == [general.feed(p) for p in pieces]
    assert fast.flush() == general.flush()


LONG = b'data: {"choices": [{"index": 0, "delta": {"content": "a long token"}}]}\n\n'


@pytest.mark.parametrize(
    ("events", "done"),
    [
        pytest.param(b"data: [DONE]\n\n", True, id="alone"),
        pytest.param(LONG + b"data: [DONE]\n\n", True, id="after-a-chunk"),
        pytest.param(LONG + b"data: [DONE]\r\n\r\n", True, id="crlf"),
        pytest.param(LONG + b"data: [DONE]\r\r", True, id="cr"),
        pytest.param(b"data:[DONE]\n\n", True, id="no-space"),
        pytest.param(LONG, False, id="a-token"),
        pytest.param(b"data: [DONE]\n\n" + LONG, False, id="not-last"),
        pytest.param(b'data: {"content": "data: [DONE]"}\n\n', False, id="in-json-text"),
        pytest.param(LONG[:-2] + b"data: [DONE]\n\n", False, id="end-of-a-long-line"),
        pytest.param(b"event: x\ndata: [DONE] \n\n", False, id="trailing-space"),
        pytest.param(b"xdata: [DONE]\n\n", False, id="other-field"),
        pytest.param(b"", False, id="empty"),
    ],
)
def test_the_streams_end_is_seen(events: bytes, done: bool) -> None:
    """Only a last event whose one data line is [DONE] ends the stream."""
    assert ends_with_done(events) is done
