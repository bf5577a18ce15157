"""SSE framing and the in-band error that ends a broken stream."""

from __future__ import annotations

import json

import pytest

from sidecar.core.errors import UpstreamTimeoutError, UpstreamUnavailableError
from sidecar.edge.relay import in_band_error
from sidecar.edge.sse_framing import EventFramer


@pytest.mark.parametrize(
    ("chunks", "out"),
    [
        pytest.param([b"data: 1\n\n"], [b"data: 1\n\n"], id="whole-event-passes-at-once"),
        pytest.param(
            [b"data: 1\n\ndata: 2\n\n"], [b"data: 1\n\ndata: 2\n\n"], id="two-events-one-chunk"
        ),
        pytest.param(
            [b'data: {"a', b'":1}\n\n'], [b"", b'data: {"a":1}\n\n'], id="event-split-in-two"
        ),
        pytest.param(
            [b"data: 1\n\ndata: 2", b"\n\n"], [b"data: 1\n\n", b"data: 2\n\n"], id="tail-held-back"
        ),
    ],
)
def test_framer_passes_whole_events_only(chunks: list[bytes], out: list[bytes]) -> None:
    """Whole events go out as they arrive; a partial event waits for its blank line."""
    framer = EventFramer()
    assert [framer.feed(chunk) for chunk in chunks] == out
    assert framer.flush() == b""


def test_framer_drops_nothing_at_a_clean_end() -> None:
    """At a clean end of stream, bytes without a final blank line are still delivered."""
    framer = EventFramer()
    assert framer.feed(b"data: [DONE]") == b""
    assert framer.flush() == b"data: [DONE]"


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        pytest.param(UpstreamTimeoutError("late"), "upstream_timeout", id="timeout"),
        pytest.param(UpstreamUnavailableError("gone"), "upstream_unavailable", id="reset"),
    ],
)
def test_in_band_error_is_an_openai_error_then_done(exc: Exception, code: str) -> None:
    """A broken stream ends with `data: {"error": ...}` and `data: [DONE]`, like vLLM's own."""
    first, second, rest = in_band_error(exc).split(b"\n\n")  # type: ignore[arg-type]
    error = json.loads(first.removeprefix(b"data: "))["error"]
    assert error["code"] == code
    assert error["message"]
    assert (second, rest) == (b"data: [DONE]", b"")
