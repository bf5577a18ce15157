"""The one place aiohttp's client errors become the sidecar's upstream errors."""

from __future__ import annotations

import inspect

import aiohttp
import pytest
from multidict import CIMultiDict

from sidecar.core.errors import UpstreamTimeoutError, UpstreamUnavailableError
from sidecar.edge.engine_client import UPSTREAM_ERRORS, end_to_end, translate

AIOHTTP_ERRORS = sorted(
    (
        cls
        for _, cls in inspect.getmembers(aiohttp.client_exceptions, inspect.isclass)
        if issubclass(cls, aiohttp.ClientError)
    ),
    key=lambda cls: cls.__name__,
)


@pytest.mark.parametrize("error_class", AIOHTTP_ERRORS, ids=lambda cls: cls.__name__)
def test_every_aiohttp_client_error_is_mapped(error_class: type[BaseException]) -> None:
    """No aiohttp client error can escape the upstream boundary untranslated."""
    assert issubclass(error_class, UPSTREAM_ERRORS)


@pytest.mark.parametrize(
    ("exc", "mapped"),
    [
        pytest.param(TimeoutError(), UpstreamTimeoutError, id="timeout"),
        pytest.param(aiohttp.ServerTimeoutError(), UpstreamTimeoutError, id="server-timeout"),
        pytest.param(
            aiohttp.ServerDisconnectedError(), UpstreamUnavailableError, id="disconnected"
        ),
        pytest.param(ConnectionRefusedError(), UpstreamUnavailableError, id="refused"),
        pytest.param(aiohttp.ClientPayloadError("cut"), UpstreamUnavailableError, id="payload"),
    ],
)
def test_translation(exc: BaseException, mapped: type[Exception]) -> None:
    """Timeouts become 504s, everything else that breaks the connection a 502."""
    assert isinstance(translate(exc), mapped)


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
