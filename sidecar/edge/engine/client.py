"""The engine, seen from the sidecar: the one place the engine client's errors are translated.

Every call to the engine (:func:`send`, :func:`read_chunk`, :func:`read_all`) runs inside
:func:`translated`: a socket failure, a timeout or an answer
that breaks HTTP/1.1 becomes an UpstreamUnavailableError (502) or UpstreamTimeoutError (504),
raised ``from`` the original, so nothing of the client's own errors leaks past this module. The
client is :mod:`sidecar.edge.engine.pool`, a pooled HTTP/1.1 client made for this one origin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from sidecar.core.errors import UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from sidecar.edge.engine.errors import EngineProtocolError
from sidecar.edge.engine.pool import EnginePool, EngineResponse

# Errors raised while talking to the engine; order matters (TimeoutError is also an OSError).
TIMEOUT_ERRORS: tuple[type[BaseException], ...] = (TimeoutError,)
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (OSError, EngineProtocolError)
UPSTREAM_ERRORS = TIMEOUT_ERRORS + UNAVAILABLE_ERRORS


def translate(exc: BaseException) -> UpstreamError:
    """Map a socket, timeout or protocol failure to the sidecar's upstream error. Its message
    reaches the client: it says what failed in the sidecar's words (EngineProtocolError's are
    ours and llhttp's fixed reasons), never with bytes the engine sent."""
    if isinstance(exc, TIMEOUT_ERRORS):
        return UpstreamTimeoutError()
    if isinstance(exc, EngineProtocolError):
        return UpstreamUnavailableError(str(exc))
    return UpstreamUnavailableError(repr(exc))


@contextmanager
def translated() -> Iterator[None]:
    """The error boundary: re-raise any engine I/O failure as the sidecar's UpstreamError."""
    try:
        yield
    except UPSTREAM_ERRORS as exc:
        raise translate(exc) from exc


async def read_chunk(response: EngineResponse) -> bytes:
    """The next bytes of the engine's body as they arrive; b"" at the end."""
    try:
        return await response.read_chunk()
    except UPSTREAM_ERRORS as exc:
        raise translate(exc) from exc


async def read_all(response: EngineResponse) -> bytes:
    """The engine's whole body."""
    with translated():
        return await response.read_all()


def release(response: EngineResponse) -> None:
    """Give the connection back for reuse if its body was read to the end; else close it.

    Closing is what tells the engine the client is gone: vLLM aborts the request and frees
    its KV blocks when its connection drops.
    """
    response.release()


async def send(
    pool: EnginePool,
    method: str,
    path_qs: str,
    headers: Mapping[str, str],
    body: bytes | None,
    *,
    sent: Callable[[], object] | None = None,
) -> EngineResponse:
    """Send one request over ``pool`` and return once the engine's status line and headers
    arrived.

    ``path_qs`` goes out exactly as given (already normalised: it is what was admitted).
    ``sent``: called once the request is written, while the engine works on it
    (:meth:`EnginePool.request`).
    """
    with translated():
        return await pool.request(method, path_qs, headers, body, sent)
