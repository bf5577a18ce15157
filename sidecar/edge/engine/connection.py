"""One kept-alive connection to the engine: an asyncio protocol over llhttp's response parser.

llhttp (httptools' ``HttpResponseParser``) parses; this protocol owns the connection's life, a
:class:`~sidecar.edge.engine.states.Phase` moved only by the rows of one table. Body bytes are
handed to the reader in the largest pieces a socket read gives; at most ``HIGH_WATER`` of them wait
for a slow reader before reading is paused (FlowControl), and the socket is read again only when
the reader comes back with none left. A reader may instead attach a :data:`Sink`: each read's
body bytes then go to it from ``data_received``, with no task woken, until it declines some (its
client's buffer is full: they stay the next read's, it is detached and reading pauses at once)
or the body ends (its last bytes are the next read's). One read timer per connection
(:mod:`read_deadline`), re-armed lazily: a relayed chunk costs no timer handle.

Failures are raised as the errors ``client.translated`` maps: ``OSError`` (a reset, an
answer cut short: ``ConnectionResetError``; ``StaleConnectionError`` when not one byte of it
came), ``TimeoutError`` (no byte for ``read_timeout_s``) and ``EngineProtocolError`` (an answer
that is not HTTP/1.1 as llhttp reads it, strictly, or bytes nobody asked for).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import httptools

from sidecar.edge.engine.errors import EngineProtocolError, StaleConnectionError, broken_answer
from sidecar.edge.engine.head import MAX_HEAD_BYTES, ResponseHead, ends_at_close, final_head
from sidecar.edge.engine.read_deadline import ReadDeadline
from sidecar.edge.engine.states import ANSWERING, EngineEvent, Phase, next_phase
from sidecar.edge.flow import FlowControl

# Body bytes held for a reader that is slower than the engine before the socket stops reading.
HIGH_WATER = 256 * 1024
# Takes one piece of the body as it arrives and says whether it did; one it declines is left,
# untouched, for the next read (and the sink is detached).
Sink = Callable[[bytes], bool]


class EngineConnection(asyncio.Protocol):
    """One connection to the engine; carries one request at a time."""

    _flow: FlowControl  # from connection_made on

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        read_timeout_s: float,
        engine_silence: Callable[[], float | None] | None = None,
    ) -> None:
        """``engine_silence``: seconds since the engine last answered elsewhere (its metrics),
        None if unknown; while no byte of an answer has come, that counts as a sign of life,
        so a long non-streaming answer times out on silence, not on its length."""
        self._loop = loop
        self._engine_silence = engine_silence
        self._deadline = ReadDeadline(
            read_timeout_s, self._timed_out, clock=loop.time, call_later=loop.call_later
        )
        self.transport: asyncio.Transport | None = None
        self.phase = Phase.IDLE
        self.error: BaseException | None = None
        self._pieces: list[bytes] = []  # body bytes parsed and not yet read
        self._held = 0  # their length
        self._sink: Sink | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._new_answer(head_request=False)

    def _new_answer(self, *, head_request: bool) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._head_request = head_request
        self.head: ResponseHead | None = None
        self._reason = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._ends_at_close = False  # the body ends where the engine closes the connection

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; not isinstance-checked: uvloop's do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        self._flow = FlowControl(self.transport)

    def data_received(self, data: bytes) -> None:
        phase = self.phase
        if phase is not Phase.BODY:
            if phase is Phase.SENT:
                self._move(EngineEvent.FIRST_BYTE)
            elif phase is not Phase.HEAD:
                self._unasked()
                return
            self._head_bytes += len(data)
        self._deadline.touch()
        self._feed(data)
        if self.phase is Phase.BODY:
            sink = self._sink
            if sink is not None and self._pieces:
                piece = self._take()
                if not sink(piece):
                    self._decline(piece)
                return
            if self._held > HIGH_WATER:
                self._flow.pause_reading()
        elif self.phase is Phase.HEAD and self._head_bytes > MAX_HEAD_BYTES:
            self._fail(EngineProtocolError("the engine's response head is too large"))
        self._wake()

    def _feed(self, data: bytes) -> None:
        """Parse ``data``; a break in it fails the connection with llhttp's reason."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__  # what one of the callbacks below raised
            if not isinstance(cause, EngineProtocolError):
                raise  # a bug of ours, not the engine's: the loop logs it and drops the socket
            self._fail(cause)
        except httptools.HttpParserError as exc:
            self._fail(broken_answer(exc))
        except httptools.HttpParserUpgrade as exc:
            self._fail(broken_answer(exc, "the engine switched protocols"))

    def _unasked(self) -> None:
        """Bytes while no answer is due: the connection cannot be trusted with another request."""
        if self.phase is Phase.IDLE:
            self._fail(EngineProtocolError("the engine sent bytes on an idle connection"))
        elif self.ended:
            self.close()  # the answer itself was whole, and stays readable

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: BaseException | None) -> None:
        self._deadline.stop()
        if self.phase is Phase.BODY and exc is None and self._ends_at_close:
            self._move(
                EngineEvent.CLOSED_AT_END
            )  # a close-delimited body ends here; a reset is not
        elif self.phase is Phase.SENT:
            self._fail(StaleConnectionError("the engine closed the connection before answering"))
        elif self.phase in ANSWERING:
            self._fail(ConnectionResetError("the engine closed the connection mid-answer"))
        elif self.phase is Phase.IDLE:
            self._fail(ConnectionResetError("the engine closed the idle connection"))
        if self.error is not None and self.error.__cause__ is None and exc is not None:
            self.error.__cause__ = exc
        self._wake()

    # llhttp's callbacks (httptools) ----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.phase is not Phase.HEAD:
            raise EngineProtocolError("the engine sent bytes after its answer")

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.phase is Phase.HEAD:  # after the body: a trailer field, which is not relayed
            self._fields.append((name, value))

    def on_headers_complete(self) -> None:
        head = final_head(self._parser.get_status_code(), self._reason, self._fields)
        if head is None:  # an interim answer: the real one follows
            self._reason, self._fields = b"", []
            return
        keep_alive = self._parser.should_keep_alive()
        head_request = self._head_request
        self._ends_at_close = not keep_alive and ends_at_close(head, head_request=head_request)
        self.head = head
        if not head_request:
            self._move(EngineEvent.HEAD)
        else:  # llhttp cannot be told that a HEAD request's answer has no body: it ends here
            self._move(EngineEvent.HEAD_ONLY if keep_alive else EngineEvent.LAST_END)

    def on_body(self, body: bytes) -> None:
        if self.phase is not Phase.BODY:
            raise EngineProtocolError("the engine sent a body it was not asked for")
        self._pieces.append(body)
        self._held += len(body)

    def on_message_complete(self) -> None:
        if self.phase is Phase.BODY:
            self._move(
                EngineEvent.BODY_END if self._parser.should_keep_alive() else EngineEvent.LAST_END
            )
        # else an interim answer's end (its head was skipped), or a HEAD request's answer

    # The reader's side -----------------------------------------------------------------------

    def send(self, request: bytes, *, head_request: bool) -> None:
        """Write one request; its answer is read with ``read_head`` and ``read``."""
        assert self.transport is not None, "connection_made first"
        self._move(EngineEvent.SEND)
        self._new_answer(head_request=head_request)
        # The read deadline counts from here: a timer left from the last answer re-arms by it.
        self._deadline.touch()
        self.transport.write(request)

    def push_to(self, sink: Sink | None) -> None:
        """Body pieces go to ``sink`` as they arrive (None: to the next read). Not while pieces
        wait: those are the next read's, and order is kept."""
        self._sink = sink if not self._pieces else None

    async def read_head(self) -> ResponseHead:
        """The answer's head, once here. An answer that broke by then, in its head or in body
        bytes that came with it, fails whole: nothing of it has gone anywhere yet."""
        while self.head is None:
            await self._wait()
        self._raise_if_broken()
        return self.head

    async def read(self) -> bytes:
        """The body bytes that arrived since the last read (waiting for some); b"" at the end.

        The socket is read again only once the reader comes back with none left waiting: what
        it took is written by then (a relay writes it, and waits for its client, first), so a
        slow client holds at most what its own socket buffer and one read of the engine's take."""
        while not self._pieces:
            if self.ended:
                return b""
            self._flow.resume_reading()
            await self._wait()
        return self._take()

    def _take(self) -> bytes:
        """The pieces waiting, as one."""
        pieces, self._pieces, self._held = self._pieces, [], 0
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _decline(self, data: bytes) -> None:
        """The sink declined ``data`` (its client's buffer is full): detached, ``data`` is the
        next read's, where it was, and the engine is not read until the reader has written it."""
        self._sink = None
        self._pieces.append(data)
        self._held += len(data)
        self._flow.pause_reading()
        self._wake()

    async def _wait(self) -> None:
        self._raise_if_broken()
        self._waiter = self._loop.create_future()
        self._deadline.watch()
        try:
            await self._waiter
        finally:
            self._waiter = None
        self._raise_if_broken()  # a callback's, while this waited

    def _raise_if_broken(self) -> None:
        if self.phase is Phase.BROKEN:
            raise self.error or ConnectionResetError("the engine connection is closed")

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.phase is not Phase.BROKEN:
            self.error = exc
            self._move(EngineEvent.FAIL)
        self.close()
        self._wake()

    def _move(self, event: EngineEvent) -> None:
        """The one way the phase changes: a row of the table in :mod:`states`."""
        self.phase = next_phase(self.phase, event)

    def _timed_out(self) -> None:
        if self._waiter is None:  # nobody reads: the next wait starts it again
            return
        timeout_s = self._deadline.timeout_s
        heard = self._engine_silence() if self._engine_silence is not None else None
        if self.phase is Phase.SENT and heard is not None and heard < timeout_s:
            self._deadline.resume(heard)  # the engine works on it (a whole answer comes late)
            return
        self._fail(TimeoutError(f"no byte from the engine for {timeout_s:g}s"))

    # The pool's side -------------------------------------------------------------------------

    @property
    def has_pieces(self) -> bool:
        """Body bytes parsed and not yet read."""
        return bool(self._pieces)

    @property
    def ended(self) -> bool:
        """The answer was parsed to its end (its last pieces may wait for a read)."""
        return self.phase is Phase.COMPLETE or self.phase is Phase.SPENT

    @property
    def closing(self) -> bool:
        """The socket is closed or closing, by either side."""
        return self.transport is None or self.transport.is_closing()

    @property
    def reusable(self) -> bool:
        """Its answer was read to the end and both sides allow another request on it."""
        return self.phase is Phase.COMPLETE and not self._pieces and not self.closing

    def park(self) -> None:
        """Kept in the pool for the next request (``reusable`` first)."""
        self._move(EngineEvent.PARK)

    def close(self) -> None:
        """Drop the connection at once: vLLM aborts the request when its connection drops. What
        it read and nobody will now is let go at once, not when a full collection finds the
        connection's reference cycles (its parser's callbacks, its transport's protocol)."""
        self._deadline.stop()
        self._pieces, self._held = [], 0
        if self.transport is not None and not self.closing:
            self.transport.abort()
