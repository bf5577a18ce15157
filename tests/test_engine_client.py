"""The engine client's one error boundary: every aiohttp failure becomes the sidecar's own error."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp
import aiohttp.client_exceptions as ce
import pytest
from aiohttp.client_reqrep import ConnectionKey
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from sidecar.core.errors import UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from sidecar.edge.engine_client import end_to_end, translated

KEY = ConnectionKey("127.0.0.1", 8000, False, True, None, None, None, None)
INFO = aiohttp.RequestInfo(URL("http://127.0.0.1:8000/v1"), "POST", CIMultiDictProxy(CIMultiDict()))
REFUSED = ConnectionRefusedError(111, "refused")

Make = Callable[[], BaseException]
OFF, LATE = UpstreamUnavailableError, UpstreamTimeoutError

# Every ClientError subclass aiohttp defines, how to make one, and what it must become.
MAPPING: dict[type[BaseException], tuple[Make, type[UpstreamError]]] = {
    ce.ClientConnectionError: (lambda: ce.ClientConnectionError("closed"), OFF),
    ce.ClientConnectionResetError: (lambda: ce.ClientConnectionResetError("reset"), OFF),
    ce.ClientConnectorCertificateError: (
        lambda: ce.ClientConnectorCertificateError(KEY, ValueError("bad cert")),
        OFF,
    ),
    ce.ClientConnectorDNSError: (lambda: ce.ClientConnectorDNSError(KEY, OSError(-2, "dns")), OFF),
    ce.ClientConnectorError: (lambda: ce.ClientConnectorError(KEY, REFUSED), OFF),
    ce.ClientConnectorSSLError: (lambda: ce.ClientConnectorSSLError(KEY, OSError(1, "ssl")), OFF),
    ce.ClientHttpProxyError: (lambda: ce.ClientHttpProxyError(INFO, (), status=407), OFF),
    ce.ClientOSError: (lambda: ce.ClientOSError(104, "reset by peer"), OFF),
    ce.ClientPayloadError: (lambda: ce.ClientPayloadError("body cut short"), OFF),
    ce.ClientProxyConnectionError: (lambda: ce.ClientProxyConnectionError(KEY, REFUSED), OFF),
    ce.ClientResponseError: (lambda: ce.ClientResponseError(INFO, (), status=500), OFF),
    ce.ClientSSLError: (lambda: ce.ClientSSLError(KEY, OSError(1, "ssl")), OFF),
    ce.ConnectionTimeoutError: (lambda: ce.ConnectionTimeoutError("connect took too long"), LATE),
    ce.ContentTypeError: (lambda: ce.ContentTypeError(INFO, (), status=200), OFF),
    ce.InvalidURL: (lambda: ce.InvalidURL("http://[::1"), OFF),
    ce.InvalidUrlClientError: (lambda: ce.InvalidUrlClientError("http://[::1"), OFF),
    ce.InvalidUrlRedirectClientError: (lambda: ce.InvalidUrlRedirectClientError("x:"), OFF),
    ce.NonHttpUrlClientError: (lambda: ce.NonHttpUrlClientError("ftp://engine"), OFF),
    ce.NonHttpUrlRedirectClientError: (lambda: ce.NonHttpUrlRedirectClientError("ftp://x"), OFF),
    ce.RedirectClientError: (lambda: ce.RedirectClientError("redirect"), OFF),
    ce.ServerConnectionError: (lambda: ce.ServerConnectionError("gone"), OFF),
    ce.ServerDisconnectedError: (ce.ServerDisconnectedError, OFF),
    ce.ServerFingerprintMismatch: (
        lambda: ce.ServerFingerprintMismatch(b"a", b"b", "127.0.0.1", 8000),
        OFF,
    ),
    ce.ServerTimeoutError: (lambda: ce.ServerTimeoutError("read timed out"), LATE),
    ce.SocketTimeoutError: (lambda: ce.SocketTimeoutError("socket read timed out"), LATE),
    ce.TooManyRedirects: (lambda: ce.TooManyRedirects(INFO, ()), OFF),
    ce.UnixClientConnectorError: (
        lambda: ce.UnixClientConnectorError("/run/engine.sock", KEY, REFUSED),
        OFF,
    ),
    ce.UploadAbortedError: (lambda: ce.UploadAbortedError("upload aborted"), OFF),
    ce.WSServerHandshakeError: (lambda: ce.WSServerHandshakeError(INFO, (), status=400), OFF),
}
SOCKET_ERRORS: list[tuple[Make, type[UpstreamError]]] = [
    (TimeoutError, LATE),
    (lambda: ConnectionResetError(104, "reset"), OFF),
    (lambda: ConnectionRefusedError(111, "refused"), OFF),
    (lambda: BrokenPipeError(32, "broken pipe"), OFF),
]


def _subclasses(cls: type[BaseException]) -> set[type[BaseException]]:
    found = set(cls.__subclasses__())
    return found.union(*(_subclasses(sub) for sub in found))


def test_the_mapping_names_every_aiohttp_client_error() -> None:
    """A new aiohttp error class fails here until the mapping says what it becomes."""
    defined = {c for c in _subclasses(aiohttp.ClientError) if c.__module__.startswith("aiohttp")}
    assert defined == set(MAPPING)


@pytest.mark.parametrize(
    ("make", "mapped"),
    [pytest.param(*MAPPING[cls], id=cls.__name__) for cls in MAPPING]
    + [pytest.param(make, mapped, id=type(make()).__name__) for make, mapped in SOCKET_ERRORS],
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
