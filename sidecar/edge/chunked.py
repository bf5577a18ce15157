"""The chunked transfer coding (RFC 9112 §7.1), decoded as an answer's bytes arrive: pure, no I/O.

:class:`ChunkedBody` is fed each socket read and returns the data it carried, in the largest
pieces it can: a read holding whole chunks with bare hex sizes (vLLM's, one event per chunk) is
taken in one tight loop; extensions, trailers and chunks split across reads go through the
general state machine. A partial chunk line is kept for the next read, up to ``MAX_CHUNK_LINE``.
``whole`` is the relay's shortcut for the common read: only whole chunks, their data in one piece,
so that the caller may pass the read's own framing on unchanged.
"""

from __future__ import annotations

from typing import Literal

from sidecar.edge.http1 import (
    HEX_DIGITS,
    MAX_CHUNK_LINE,
    MAX_SIZE_DIGITS,
    EngineProtocolError,
    chunk_size,
)

State = Literal["size", "data", "data_end", "trailer"]

# How far past a chunk's start its size line's CRLF may be: a bare size of MAX_SIZE_DIGITS.
_SIZE_REACH = MAX_SIZE_DIGITS + 2
# How a read ends that also ends the body (the last chunk, no trailer): ``feed``'s, not ``whole``'s.
_BODY_END = b"\r\n0\r\n\r\n"
# The size line of every chunk size of 1 to 3 hex digits, as engines write it (lower case, no
# leading zeros), for ``whole`` to check a one-chunk read against: 184 KiB, built at import.
_SIZE_LINES = tuple(b"%x\r\n" % size for size in range(1 << 12))


class ChunkedBody:
    """One chunked body; ``done`` once its last chunk and trailer section were read."""

    __slots__ = ("_line", "_remaining", "_state", "done")

    def __init__(self) -> None:
        self._state: State = "size"
        self._remaining = 0  # bytes left in the current chunk
        self._line = b""  # a chunk line not yet complete
        self.done = False

    def feed(self, data: bytes) -> list[bytes]:
        """The body data in ``data`` (after what came before); EngineProtocolError if broken."""
        if self.done:
            if data:
                raise EngineProtocolError("the engine sent bytes after its answer")
            return []
        if self._line:
            data, self._line = self._line + data, b""
        pieces: list[bytes] = []
        at = self._whole_chunks(data, pieces) if self._state == "size" else 0
        size = len(data)
        while at < size:
            if self._state == "data":
                take = min(self._remaining, size - at)
                pieces.append(data[at : at + take] if take < size else data)
                at += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = "data_end"
                continue
            end = data.find(b"\r\n", at)
            if end < 0:
                if size - at > MAX_CHUNK_LINE:
                    raise EngineProtocolError("the engine sent an overlong chunk line")
                self._line = data[at:]
                break
            at = self._line_done(data[at:end], end + 2, size)
        return pieces

    def whole(self, data: bytes) -> bytes | None:
        """The data ``data`` carries when it is complete chunks with bare hex sizes and nothing
        else, none of them the last, read between chunks: an event stream's usual read (vLLM's
        is one event per chunk). None otherwise, with nothing consumed: ``feed`` then takes it.
        EngineProtocolError where a chunk does not end where its size says."""
        if self._state != "size" or self._line:
            return None
        # One chunk, the common read: its length fixes its size's digits and the size itself (n =
        # digits + size), so one comparison with the table checks its size line: no search, no
        # parse. Anything else (more chunks, upper-case hex, 4 digits) goes to _whole_read.
        # Sizes 1-15 give n of 2-16, 16-255 give 18-257, 256-4095 (the table's last) 259-4098.
        n = len(data) - 4
        digits = 2 if 17 < n < 258 else 3 if 258 < n < 4099 else 1 if 1 < n < 17 else 0
        if digits and data[: digits + 2] == _SIZE_LINES[n - digits] and data[-2:] == b"\r\n":
            return data[digits + 2 : -2]
        return self._whole_read(data)

    def _whole_read(self, data: bytes) -> bytes | None:
        """``whole`` for a read the table does not settle, found by searching and parsing."""
        end = data.find(b"\r\n")  # unbounded: find's start and end arguments cost ~0.1 us
        if not 0 < end <= MAX_SIZE_DIGITS or (size := data[:end]).strip(HEX_DIGITS):
            return None
        start = end + 2
        stop = start + int(size, 16)
        if stop == start:
            return None  # the last chunk: the general path ends the body
        if stop + 2 == len(data):  # one chunk
            if not data.endswith(b"\r\n"):
                raise EngineProtocolError("the engine's chunk did not end where it said")
            return data[start:stop]
        pieces: list[bytes] = []
        # A read that ends the body is feed's, without a scan here first (feed scans it again).
        if data.endswith(_BODY_END) or self._whole_chunks(data, pieces) != len(data):
            return None
        return b"".join(pieces)

    def _line_done(self, line: bytes, at: int, size: int) -> int:
        """Act on one complete line (a size, a chunk's end, a trailer); where to go on."""
        if self._state == "size":
            self._remaining = chunk_size(line)
            self._state = "data" if self._remaining else "trailer"
        elif self._state == "data_end":
            if line:
                raise EngineProtocolError("the engine's chunk did not end where it said")
            self._state = "size"
        elif not line:  # the empty line after the last chunk (and any trailer fields)
            self.done = True
            if at < size:
                raise EngineProtocolError("the engine sent bytes after its answer")
            return size
        return at

    @staticmethod
    def _whole_chunks(data: bytes, pieces: list[bytes]) -> int:
        """The fast path: complete chunks with a bare hex size, back to back, taken in one
        loop; returns where the general state machine goes on."""
        at, size, find, append = 0, len(data), data.find, pieces.append
        while True:
            end = find(b"\r\n", at, at + _SIZE_REACH)
            if end <= at:  # no size line here (-1), or an empty one
                return at
            line = data[at:end]
            if line.strip(HEX_DIGITS):
                return at  # an extension, or not a size at all: the general path says which
            start = end + 2
            stop = start + int(line, 16)
            if stop == start or stop + 2 > size:
                return at  # the last chunk, or one not all here yet
            if find(b"\r\n", stop, stop + 2) < 0:
                raise EngineProtocolError("the engine's chunk did not end where it said")
            append(data[start:stop])
            at = stop + 2
