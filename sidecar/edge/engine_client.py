"""The engine, seen from the sidecar: one HTTP client, and the one place its errors are translated.

Every call to the engine runs inside :func:`translated`: an aiohttp or socket failure becomes an
UpstreamUnavailableError (502) or UpstreamTimeoutError (504), raised ``from`` the original, so
nothing of aiohttp's error tree leaks past this module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from sidecar.core.errors import UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError

# RFC 9110 §7.6.1 hop-by-hop fields, plus the framing fields aiohttp recomputes on each side.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)

# Errors raised while talking to the engine; order matters (timeouts are also OSErrors).
TIMEOUT_ERRORS: tuple[type[BaseException], ...] = (asyncio.TimeoutError, aiohttp.ServerTimeoutError)
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError)
UPSTREAM_ERRORS = TIMEOUT_ERRORS + UNAVAILABLE_ERRORS


def translate(exc: BaseException) -> UpstreamError:
    """Map an aiohttp/socket failure to the sidecar's upstream error."""
    if isinstance(exc, TIMEOUT_ERRORS):
        return UpstreamTimeoutError()
    return UpstreamUnavailableError(repr(exc))


@contextmanager
def translated() -> Iterator[None]:
    """The error boundary: re-raise any engine I/O failure as the sidecar's UpstreamError."""
    try:
        yield
    except UPSTREAM_ERRORS as exc:
        raise translate(exc) from exc


def end_to_end(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """Headers without hop-by-hop fields (and those named in the Connection header)."""
    connection = headers.get("Connection")
    drop = HOP_BY_HOP
    if connection:  # most requests name no extra fields: no set built
        drop = HOP_BY_HOP | {token.strip().lower() for token in connection.split(",")}
    return CIMultiDict([(k, v) for k, v in headers.items() if k.lower() not in drop])


async def read_chunk(response: aiohttp.ClientResponse) -> bytes:
    """The next bytes of the engine's body as they arrive; b"" at the end."""
    # Once per relayed chunk: a bare try costs nothing, entering ``translated()`` about 1 us.
    try:
        return await response.content.readany()
    except UPSTREAM_ERRORS as exc:
        raise translate(exc) from exc


async def read_all(response: aiohttp.ClientResponse) -> bytes:
    """The engine's whole body."""
    with translated():
        return await response.read()


def finish(response: aiohttp.ClientResponse) -> None:
    """Give the connection back for reuse if its body was read to the end; else close it.

    Closing is what tells the engine the client is gone: vLLM aborts the request and frees
    its KV blocks when its connection drops.
    """
    if response.content.is_eof():
        response.release()
    else:
        response.close()


class Upstream:
    """Sends requests to the engine; owns its aiohttp session."""

    def __init__(self, base_url: str, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # auto_decompress=False: bytes are relayed as the engine encoded them, headers and all.
        # No Accept-Encoding of aiohttp's own: the engine may encode only what the client accepts.
        connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=self._timeout,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding",),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            msg = "Upstream.start() was not awaited"
            raise RuntimeError(msg)
        return self._session

    async def send(
        self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes | None
    ) -> aiohttp.ClientResponse:
        """Send one request and return once the engine's status line and headers arrived.

        ``path_qs`` goes out exactly as given (already normalised: it is what was admitted).
        """
        with translated():
            return await self.session.request(
                method,
                URL(self.base_url + path_qs, encoded=True),
                headers=headers,
                data=body,
                allow_redirects=False,
            )
