"""The engine client's one error boundary: every engine I/O failure becomes the sidecar's error."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable

import pytest
from multidict import CIMultiDict

from sidecar.core.errors import UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from sidecar.edge.engine.client import translated
from sidecar.edge.engine.errors import (
    EngineProtocolError,
    StaleConnectionError,
    UnsendableRequestError,
)
from sidecar.edge.engine.http1 import end_to_end

Make = Callable[[], BaseException]
OFF, LATE = UpstreamUnavailableError, UpstreamTimeoutError

# What the engine client (sidecar.edge.engine.pool) and the socket layer under it raise, and
# what each must become: 504 for time, 502 for everything else.
FAILURES: list[tuple[Make, type[UpstreamError]]] = [
    (lambda: TimeoutError("no byte from the engine for 300s"), LATE),
    (lambda: ConnectionResetError(104, "reset"), OFF),
    (lambda: ConnectionRefusedError(111, "refused"), OFF),
    (lambda: ConnectionAbortedError(103, "aborted"), OFF),
    (lambda: BrokenPipeError(32, "broken pipe"), OFF),
    (lambda: socket.gaierror(-2, "Name or service not known"), OFF),
    (lambda: ssl.SSLCertVerificationError(1, "certificate verify failed"), OFF),
    (lambda: OSError(113, "no route to host"), OFF),
    (lambda: EngineProtocolError("the engine's status line is not HTTP/1.x"), OFF),
    (lambda: UnsendableRequestError("a header field holds a line break"), OFF),
    (lambda: StaleConnectionError("closed before answering"), OFF),
]


@pytest.mark.parametrize(
    ("make", "mapped"),
    [pytest.param(make, mapped, id=type(make()).__name__) for make, mapped in FAILURES],
)
def test_translated_raises_the_mapped_class_from_the_original(
    make: Make, mapped: type[UpstreamError]
) -> None:
    """Each failure becomes exactly its mapped class, chained to the original."""
    original = make()
    with pytest.raises(UpstreamError) as caught, translated():
        raise original
    assert type(caught.value) is mapped
    assert caught.value.__cause__ is original


def test_other_errors_pass_the_boundary_untouched() -> None:
    """Our own bugs are not disguised as engine failures."""
    with pytest.raises(KeyError), translated():
        raise KeyError("bug")


def test_hop_by_hop_headers_are_dropped() -> None:
    """Connection-level headers, and those the Connection header names, are not forwarded."""
    headers = CIMultiDict(
        {
            "Connection": "keep-alive, X-Private",
            "X-Private": "1",
            "Transfer-Encoding": "chunked",
            "Content-Length": "12",
            "Authorization": "Bearer k",
            "Content-Type": "application/json",
        }
    )
    assert dict(end_to_end(headers)) == {
        "Authorization": "Bearer k",
        "Content-Type": "application/json",
    }
