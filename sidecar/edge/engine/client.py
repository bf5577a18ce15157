"""The engine, seen from the sidecar: one HTTP client, and the one place its errors are translated.

Every call to the engine runs inside :func:`translated`: a socket failure, a timeout or an answer
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


class Upstream:
    """Sends requests to the engine over its pool of kept-alive connections."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        engine_silence: Callable[[], float | None] | None = None,
    ) -> None:
        """``engine_silence``: seconds since the engine last answered its probe (None: not
        probed); a request still waiting for its answer's first byte is not timed out while
        the engine answers (:class:`sidecar.edge.engine.connection.EngineConnection`)."""
        self.base_url = base_url.rstrip("/")
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._engine_silence = engine_silence
        self._pool: EnginePool | None = None

    async def start(self) -> None:
        # Bytes are relayed as the engine encoded them, and nothing asks for an encoding of its
        # own: the engine may encode only what the client accepts.
        self._pool = EnginePool(
            self.base_url,
            connect_timeout_s=self._connect_timeout_s,
            read_timeout_s=self._read_timeout_s,
            engine_silence=self._engine_silence,
        )

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    @property
    def idle_connections(self) -> int:
        """Kept-alive engine connections waiting for a request (at most pool.MAX_IDLE)."""
        return 0 if self._pool is None else self._pool.idle

    async def send(
        self,
        method: str,
        path_qs: str,
        headers: Mapping[str, str],
        body: bytes | None,
        sent: Callable[[], object] | None = None,
    ) -> EngineResponse:
        """Send one request and return once the engine's status line and headers arrived.

        ``path_qs`` goes out exactly as given (already normalised: it is what was admitted).
        ``sent``: called once the request is written, while the engine works on it
        (:meth:`EnginePool.request`).
        """
        if self._pool is None:
            msg = "Upstream.start() was not awaited"
            raise RuntimeError(msg)
        with translated():
            return await self._pool.request(method, path_qs, headers, body, sent)
