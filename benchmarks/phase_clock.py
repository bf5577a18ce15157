"""The sidecar with a clock at each phase of a request: where a request's time goes, by the clock,
in a real run (``relay_bench`` with ``BENCH_SIDECAR_PHASES=FILE``).

``python -m benchmarks.phase_clock FILE serve`` runs ``sidecar serve`` with the marks below
wrapped around the functions that end each phase, and writes every request's marks to FILE (JSON)
when the process exits. A mark is ``time.perf_counter_ns()``, CLOCK_MONOTONIC on Linux, so the
bench that started the process can tell which of its measurements a request belongs to.

The phases, each the span from the mark before it:

- ``head``: the first byte of the request read (llhttp's ``on_message_begin``) to its head
  parsed and its handler task made (``on_headers_complete``);
- ``task``: to the handler task's first step (``proxy.handle``);
- ``checked``: to the body read, checked and priced (``proxy._intake``);
- ``admitted``: to the permit held (``Permit.__aenter__``);
- ``engine``: to the engine's request written (``EngineConnection.send``);
- ``answer``: to the engine's status line and fields read (``EngineConnection.read_head``): the
  engine's own time, mostly;
- ``out``: to the first bytes written to the client (``StreamResponse``).

Each wrapper is a call more (an ``async`` one, a coroutine more), so the spans are a little longer
than without the clock: compare them with each other, and with runs under the clock, not with a
run without it.
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import inspect
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.edge import proxy
from sidecar.edge.connection import Connection
from sidecar.edge.engine_connection import EngineConnection
from sidecar.edge.response import StreamResponse
from sidecar.entry.cli import main as sidecar_main
from sidecar.limiter.permit import Permit

PHASES = ("head", "task", "checked", "admitted", "engine", "answer", "out")
_now = time.perf_counter_ns
# The request being served, in this context: its first read's time and the marks since.
_ROW: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("row", default=None)
_ROWS: list[dict[str, int]] = []


def _mark(name: str) -> None:
    row = _ROW.get()
    if row is not None and name not in row:
        row[name] = _now()


def _marked(method: Callable[..., Any], name: str, *, after: bool) -> Callable[..., Any]:
    """``method`` with the mark ``name`` put before its call or after it (after its await, for a
    coroutine function)."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def awaited(*args: Any, **kwargs: Any) -> Any:
            if not after:
                _mark(name)
            result = await method(*args, **kwargs)
            if after:
                _mark(name)
            return result

        return awaited

    @functools.wraps(method)
    def called(*args: Any, **kwargs: Any) -> Any:
        if not after:
            _mark(name)
        result = method(*args, **kwargs)
        if after:
            _mark(name)
        return result

    return called


def _begin(method: Callable[[Connection], None]) -> Callable[[Connection], None]:
    @functools.wraps(method)
    def begun(self: Connection) -> None:
        # A protocol callback: the handler task made from here copies this context, and its row.
        row = {"read": _now()}
        _ROWS.append(row)
        _ROW.set(row)
        method(self)

    return begun


def install() -> None:
    """Wrap the phase ends (before ``serve`` builds its handler, which looks ``handle`` up)."""
    Connection.on_message_begin = _begin(Connection.on_message_begin)  # type: ignore[method-assign, assignment]
    ends: list[tuple[object, str, str, bool]] = [  # where, what, the mark, after the call
        (Connection, "on_headers_complete", "head", True),
        (proxy, "handle", "task", False),
        (proxy, "_intake", "checked", True),
        (Permit, "__aenter__", "admitted", True),
        (EngineConnection, "send", "engine", False),
        (EngineConnection, "read_head", "answer", True),
        (StreamResponse, "_send", "out", False),
        (StreamResponse, "write_now", "out", False),
    ]
    for owner, attribute, name, after in ends:
        setattr(owner, attribute, _marked(getattr(owner, attribute), name, after=after))


def spans(row: dict[str, int]) -> dict[str, float]:
    """A request's phases in µs, each from the mark before it; a phase it never reached (a
    refusal, a free path) is left out, and so is every one after it."""
    out: dict[str, float] = {}
    last = row["read"]
    for name in PHASES:
        if name not in row:
            break
        out[name] = (row[name] - last) / 1e3
        last = row[name]
    return out


def main() -> int:
    path, argv = sys.argv[1], sys.argv[2:]
    install()

    def write() -> None:
        Path(path).write_text(json.dumps(_ROWS), encoding="utf-8")

    atexit.register(write)
    return sidecar_main(argv)


if __name__ == "__main__":
    sys.exit(main())
