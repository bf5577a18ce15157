"""The Accept header decides which busy answer a client gets: the fallback event or a 429/503."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.request.accept import (
    EVENT_STREAM,
    JSON,
    media_ranges,
    quality,
    wants_event_stream,
)

# What real clients send (their own code: see docs/clients.md for where each line comes from).
OPENAI_PYTHON = "application/json"  # openai/_base_client.py default_headers, stream or not
OPENAI_NODE = "application/json"  # openai-node src/client.ts buildHeaders, stream or not
EVENT_SOURCE = "text/event-stream"  # WHATWG HTML, EventSource: the request's Accept header
CURL = "*/*"


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        pytest.param(None, True, id="no-accept-header"),
        pytest.param("", True, id="empty"),
        pytest.param(CURL, True, id="curl-any"),
        pytest.param(EVENT_SOURCE, True, id="eventsource"),
        pytest.param(OPENAI_PYTHON, False, id="openai-python"),
        pytest.param("Application/JSON", False, id="json-case-insensitive"),
        pytest.param("application/json, text/event-stream", True, id="both-equal"),
        pytest.param("text/event-stream;q=0.8, application/json", False, id="json-preferred"),
        pytest.param("application/json;q=0.5, text/event-stream", True, id="sse-preferred"),
        pytest.param("application/json, */*;q=0.1", False, id="json-then-anything"),
        pytest.param("text/*, application/json;q=0.9", True, id="text-wildcard"),
        pytest.param("text/event-stream;q=0", False, id="sse-refused"),
        pytest.param("text/event-stream;q=0, */*", False, id="sse-refused-over-any"),
        pytest.param("*/*;q=0.5, application/json;q=0.5", True, id="tie-by-wildcard"),
        pytest.param("text/html", False, id="neither"),
        pytest.param("text/event-stream; charset=utf-8", True, id="sse-with-param"),
        pytest.param("text/event-stream ; Q=1.000", True, id="q-name-any-case"),
        pytest.param("application/json;q=2, text/event-stream;q=0.1", True, id="bad-q-dropped"),
        pytest.param("application/json;q=abc", True, id="only-bad-element-as-absent"),
        pytest.param("garbage, ,;;", True, id="malformed-as-absent"),
        pytest.param("*/json, text/event-stream;q=0.2", True, id="star-subtype-dropped"),
    ],
)
def test_which_clients_get_the_event_stream(accept: str | None, expected: bool) -> None:
    """Each header against the answer its client acts on."""
    assert wants_event_stream(accept) is expected


@pytest.mark.parametrize(
    ("accept", "media_type", "q"),
    [
        pytest.param("text/*;q=0.3, text/event-stream;q=0.7", EVENT_STREAM, 0.7, id="exact-wins"),
        pytest.param("text/event-stream;q=0.7, text/*;q=0.3", EVENT_STREAM, 0.7, id="order-free"),
        pytest.param("*/*;q=0.2, text/*;q=0.4", EVENT_STREAM, 0.4, id="type-over-any"),
        pytest.param("*/*;q=0.2", JSON, 0.2, id="any-only"),
        pytest.param("text/plain", JSON, 0.0, id="no-match"),
        pytest.param("application/json;q=0.123", JSON, 0.123, id="three-digits"),
        pytest.param("application/json;q=0.1234", JSON, 0.0, id="four-digits-dropped"),
        pytest.param("application/json;q=1.", JSON, 1.0, id="one-dot"),
    ],
)
def test_quality_of_a_media_type(accept: str, media_type: str, q: float) -> None:
    """The most specific matching range gives the quality (RFC 9110 §12.5.1's example)."""
    assert quality(media_ranges(accept), media_type) == q


def test_an_endless_header_is_read_to_a_bound() -> None:
    """Ranges past the 64th are not read: the work on a hostile header stays bounded."""
    accept = ", ".join(["text/html"] * 64 + ["text/event-stream"])
    assert not wants_event_stream(accept)


@given(st.text(max_size=200))
def test_malformed_input_never_raises(accept: str) -> None:
    """Any text at all: an answer, never an exception."""
    assert isinstance(wants_event_stream(accept), bool)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["*/*", "text/*", EVENT_STREAM, JSON, "application/*", "text/html"]),
            st.sampled_from(["", ";q=0", ";q=0.5", ";q=1", ";q=0.25"]),
        ),
        max_size=6,
    )
)
def test_qualities_are_within_zero_and_one(elements: list[tuple[str, str]]) -> None:
    """Every well-formed header parses whole, and every quality it gives is a qvalue."""
    accept = ", ".join(f"{name}{q}" for name, q in elements)
    ranges = media_ranges(accept)
    assert len(ranges) == len(elements)
    assert all(0.0 <= quality(ranges, t) <= 1.0 for t in (EVENT_STREAM, JSON))
