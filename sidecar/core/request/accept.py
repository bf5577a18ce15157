"""Which busy answer a client acts on, read from its ``Accept`` header (RFC 9110 §12.5.1).

An event-stream client (a browser's ``EventSource`` sends ``Accept: text/event-stream``) listens
for the in-band ``fallback`` event; the openai SDKs (Python and Node) send ``Accept:
application/json`` even for ``stream=True`` and retry only a 429/503, so they get those.
"""

from __future__ import annotations

import re

EVENT_STREAM = "text/event-stream"
JSON = "application/json"

# RFC 9110 §5.6.2: a token; a media range is token "/" token (RFC 9110 §12.5.1).
_RANGE = re.compile(r"^([!#$%&'*+.^_`|~0-9a-z-]+)/([!#$%&'*+.^_`|~0-9a-z-]+)$")
# RFC 9110 §12.4.2: qvalue = ( "0" [ "." 0*3DIGIT ] ) / ( "1" [ "." 0*3("0") ] )
_QVALUE = re.compile(r"^(0(\.[0-9]{0,3})?|1(\.0{0,3})?)$")
# The most an Accept header is read for: past it, the rest is ignored (a bound on the work).
MAX_ELEMENTS = 64


def media_ranges(accept: str) -> list[tuple[str, str, float]]:
    """The header's well-formed media ranges as (type, subtype, q), lowercased, in order; an
    element that is not a valid range, or whose q is not a valid qvalue, is left out."""
    ranges = []
    for element in accept.split(",")[:MAX_ELEMENTS]:
        parsed = _media_range(element)
        if parsed is not None:
            ranges.append(parsed)
    return ranges


def _media_range(element: str) -> tuple[str, str, float] | None:
    name, *params = element.split(";")
    match = _RANGE.match(name.strip().lower())
    if match is None:
        return None
    kind, subtype = match.groups()
    if kind == "*" and subtype != "*":
        return None  # "*/json" is no media range
    q = 1.0
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            if _QVALUE.match(value.strip()) is None:
                return None
            q = float(value.strip())
    return kind, subtype, q


def quality(ranges: list[tuple[str, str, float]], media_type: str) -> float:
    """How much ``ranges`` accept ``media_type``: the q of the most specific range that matches
    it (``type/subtype`` over ``type/*`` over ``*/*``), 0 where none does."""
    kind, _, subtype = media_type.partition("/")
    best: tuple[int, float] = (-1, 0.0)
    for r_kind, r_subtype, q in ranges:
        if (r_kind, r_subtype) == (kind, subtype):
            rank = 2
        elif (r_kind, r_subtype) == (kind, "*"):
            rank = 1
        elif (r_kind, r_subtype) == ("*", "*"):
            rank = 0
        else:
            continue
        if rank > best[0] or (rank == best[0] and q > best[1]):
            best = (rank, q)
    return best[1]


def wants_event_stream(accept: str | None) -> bool:
    """Whether the busy answer is the in-band ``fallback`` event: the client accepts
    ``text/event-stream`` (q > 0) at least as much as ``application/json``.

    No ``Accept`` header means any type (RFC 9110 §12.5.1), and so does one with no well-formed
    range in it: both keep the event stream. A client that accepts neither type gets the HTTP
    answer, whose status any client understands.
    """
    ranges = media_ranges(accept) if accept is not None else []
    if not ranges:
        return True
    event_stream = quality(ranges, EVENT_STREAM)
    return event_stream > 0 and event_stream >= quality(ranges, JSON)
