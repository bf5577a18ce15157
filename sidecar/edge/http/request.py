"""A client's request on a port of the sidecar, as the handler sees it: its head, parsed once by the
connection (:mod:`sidecar.edge.http.server`), and its body, buffered as it arrives up to the body
limit.

The handler starts as soon as the head is complete, so routing, the gate and a refusal never wait
for a body; :meth:`Request.read` waits for the rest of it.
"""

from __future__ import annotations

import asyncio
from typing import Literal, Protocol, cast, get_args

from multidict import CIMultiDict

from sidecar.core.errors import EdgeRefusedError, RequestError
from sidecar.edge.http.limits import BodyBudget, BudgetFault
from sidecar.edge.message import encode_head, status_line

BodyFault = Literal["too_large", "bad_framing", "tiny_chunks", "cut_off", "stalled"] | BudgetFault
NO_ROOM: frozenset[BodyFault] = frozenset(get_args(BudgetFault))
CONTINUE = encode_head([status_line(100)])


class Wire(Protocol):
    """The connection a request came on, as its answer needs it."""

    @property
    def paused(self) -> bool:
        """The client's socket buffer is full: writers wait in drain()."""
        ...

    @property
    def lost(self) -> bool:
        """The client's connection is gone."""
        ...

    async def drain(self) -> None: ...

    def rested_s(self) -> float:
        """How long the connection has been resting (the read floor:
        :mod:`sidecar.edge.http.read_floor`): not read, what its client sends waiting in the
        kernel; 0 while it is read."""
        ...

    def keeps(self, request: Request) -> bool:
        """Whether the connection may carry another request after this one's answer."""
        ...


class Request:
    """One request: method, target, version, fields, and a body that may still be arriving."""

    __slots__ = (
        "_body",
        "_charged",
        "_continued",
        "_fault",
        "_waiter",
        "body_exists",
        "budget",
        "client",
        "client_max_size",
        "complete",
        "headers",
        "keep_alive",
        "method",
        "raw_path",
        "received",
        "started",
        "task",
        "transport",
        "version",
        "wire",
    )

    def __init__(
        self,
        method: str,
        raw_path: str,
        version: tuple[int, int],
        headers: CIMultiDict[str],
        *,
        transport: asyncio.Transport,
        wire: Wire,
        client_max_size: int,
        keep_alive: bool,
        body_exists: bool,
        budget: BodyBudget | None = None,
        client: str = "",
    ) -> None:
        self.method, self.raw_path, self.version, self.headers = method, raw_path, version, headers
        self.transport, self.wire = transport, wire
        self.client_max_size = client_max_size
        self.keep_alive = keep_alive  # the client's wish, by its version and Connection field
        self.body_exists = body_exists
        self.complete = not body_exists  # the whole message was read off the connection
        self._continued = False  # a 100 Continue went out
        self.started = False  # a streamed answer was begun
        self.task: asyncio.Task[None] | None = None  # the handler's, once it runs
        # One buffer, not a list of the parser's pieces: a body sent 2 bytes at a time would
        # otherwise hold a bytes object (35 bytes) and a list slot per 2 bytes, 20x and more of
        # what the budget counts. What is held is what is counted (bytearray's slack aside).
        self._body = bytearray()
        self.received = 0  # body bytes so far
        self.budget = budget  # the port's, charged for the bytes held here
        self.client = client  # its IP address ("" where none), whose share of the budget counts
        self._charged = 0
        self._fault: BodyFault | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def fault(self) -> BodyFault | None:
        return self._fault

    @property
    def allows_another(self) -> bool:
        """The client asked to keep the connection, and the body was read off it whole."""
        return self.keep_alive and self.complete and self._fault is None

    # The connection's side: body bytes as they are parsed, then the end, or what broke it.

    def feed(self, data: bytes) -> None:
        if self._fault is not None:
            return
        self.received += len(data)
        if self.received > self.client_max_size:
            self.fail("too_large")
            return
        if self.budget is not None:
            refused = self.budget.take(len(data), self.client, self)
            if refused is not None:
                self.fail(refused)
                return
            self._charged += len(data)
        self._body += data

    def end_of_body(self) -> None:
        self.complete = True
        if self.budget is not None:
            self.budget.arrived(self)
        self._wake()

    def stall(self) -> None:
        """The port's body budget needs the room this body holds, and it has sent nothing for a
        while: it ends as too slow (408 ``body_timeout``)."""
        self.fail("stalled")

    def fail(self, fault: BodyFault) -> None:
        if self._fault is None:
            self._fault = fault
        self._body = bytearray()
        self.release()
        self._wake()

    def release(self) -> None:
        """Give the port's budget back what this request's body held (once it has ended)."""
        if self.budget is not None:
            self.budget.arrived(self)
            self.budget.give(self._charged, self.client)
        self._charged = 0

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # The handler's side.

    async def read(self) -> bytes:
        """The whole body; RequestError if it is over the limit, badly framed or cut off."""
        while not self.complete and self._fault is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        fault = self._fault
        if fault in NO_ROOM:
            budget = self.budget
            raise EdgeRefusedError(
                cast(BudgetFault, fault), budget.room_s() if budget is not None else 1.0
            )
        if fault == "stalled":
            raise EdgeRefusedError("body_timeout")
        if fault is not None:
            raise _body_error(fault, self.client_max_size)
        return bytes(self._body)

    def send_continue(self) -> None:
        """Tell a client that waits (curl does, for bodies over 1 KiB) to send its body."""
        if not self._continued and not self.transport.is_closing():
            self._continued = True
            self.transport.write(CONTINUE)


def _body_error(fault: BodyFault, limit: int) -> RequestError:
    """The client's error (no room in the budget is the server's: a 503, raised apart)."""
    if fault == "too_large":
        return RequestError(
            f"request body is larger than this server's limit of {limit} bytes",
            status=413,
            code="body_too_large",
        )
    if fault == "bad_framing":  # a bad chunk size, a broken encoding: never echoed
        return RequestError("request body is not valid HTTP/1.1 framing", code="bad_body")
    if fault == "tiny_chunks":
        return RequestError(
            "request body chunks are too small: send chunks of 256 bytes or more on average",
            code="bad_body",
        )
    return RequestError("request body ended early", code="incomplete_body")
