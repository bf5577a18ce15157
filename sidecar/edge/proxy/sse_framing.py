"""Where SSE events end, per the spec: lines end in CRLF, LF or CR; an event ends at a blank line.

Pure and incremental: each byte is scanned once (a CR at the end of one chunk is remembered, so
a CRLF split across two chunks is one line end), and only an event still being received is held.
"""

from __future__ import annotations

import re

_EOL = re.compile(rb"\r\n|\r|\n")
# An event that never ends is passed on once this big, rather than held without bound.
MAX_HELD_BYTES = 1 << 20
# b"\r" as an int: ``CR in chunk`` tells whether an event may end in CR at all.
CR = 13
# The value of an OpenAI stream's last event, ``data: [DONE]``.
DONE = b"[DONE]"
# The tail of a chunk that can hold the whole last line of a ``data: [DONE]`` event, its ends, and
# the line end before it.
_DONE_TAIL = 32


class EventFramer:
    """Passes on whole SSE events only, holding back a partial one until its blank line arrives.

    Complete events go out the moment they arrive (nothing is batched); only the bytes of an event
    whose blank line has not come yet wait. If the engine dies mid-event, those bytes are dropped,
    so the client's parser sees whole events, then our in-band error, never a torn line.
    """

    __slots__ = ("_after_cr", "_held", "_line_empty", "max_held")

    def __init__(self, max_held: int = MAX_HELD_BYTES) -> None:
        self._held = bytearray()
        self._line_empty = True  # the next byte starts a line that has no content yet
        self._after_cr = False  # the last byte seen was a CR (a LF next would complete a CRLF)
        self.max_held = max_held

    def feed(self, chunk: bytes) -> bytes:
        """The bytes now ready to send: everything up to the last complete event. A chunk of
        whole LF-ended events with nothing held before it is given back as it is (the same
        object), so a caller can tell that it passed unchanged."""
        clean = not self._held and not self._after_cr
        if clean and chunk[-2:] == b"\n\n" and CR not in chunk:
            self._line_empty = True
            return chunk
        cut = self._last_event_end(chunk)
        if cut < 0:
            self._held += chunk
            if len(self._held) <= self.max_held:
                return b""
            return self.flush()
        ready = bytes(self._held) + chunk[:cut] if self._held else chunk[:cut]
        self._held = bytearray(chunk[cut:])
        return ready

    def flush(self) -> bytes:
        """Whatever is held (at the end of a stream that ended cleanly)."""
        rest, self._held = bytes(self._held), bytearray()
        return rest

    def _last_event_end(self, chunk: bytes) -> int:
        """Index just past the last blank line in ``chunk`` (-1 if none); updates line state."""
        if not self._after_cr and CR not in chunk:
            return self._last_lf_event_end(chunk)
        return self._last_any_event_end(chunk)

    def _last_any_event_end(self, chunk: bytes) -> int:
        """The general case: any mix of CRLF, LF and CR, a CRLF split across chunks."""
        start = 1 if self._after_cr and chunk.startswith(b"\n") else 0
        line_begin = start if self._line_empty else -1
        cut = -1
        for match in _EOL.finditer(chunk, start):
            if match.start() == line_begin:
                cut = match.end()
            line_begin = match.end()
        if chunk:
            self._line_empty = line_begin == len(chunk)
            self._after_cr = chunk.endswith(b"\r")
        return cut

    def _last_lf_event_end(self, chunk: bytes) -> int:
        """The same, for a chunk with LF line ends only (vLLM's): two C-level scans."""
        cut = chunk.rfind(b"\n\n")
        if cut >= 0:
            cut += 2
        elif self._line_empty and chunk.startswith(b"\n"):
            cut = 1  # the blank line that ends an event is this chunk's first byte
        if chunk:
            self._line_empty = chunk.endswith(b"\n")
        return cut


def ends_with_done(events: bytes) -> bool:
    """Whether ``events`` (whole events, as :class:`EventFramer` passes them on) end with the
    stream's last event, ``data: [DONE]``. Only the tail is read: one short scan per chunk."""
    tail = events[-_DONE_TAIL:]
    if DONE not in tail:
        return False
    tail = tail.rstrip(b"\r\n")
    start = max(tail.rfind(b"\n"), tail.rfind(b"\r")) + 1
    if start == 0 and len(events) > _DONE_TAIL:
        return False  # a line longer than the tail: never the [DONE] line
    name, colon, value = tail[start:].partition(b":")
    return bool(colon) and name == b"data" and value.removeprefix(b" ") == DONE
