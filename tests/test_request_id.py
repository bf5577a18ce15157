"""A client's X-Request-Id is kept only where it is a bounded, visible token."""

from __future__ import annotations

import pytest

from sidecar.core.request.request_id import MAX_REQUEST_ID, accepted_request_id


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            id="uuid",
        ),
        pytest.param("a" * MAX_REQUEST_ID, "a" * MAX_REQUEST_ID, id="longest"),
        pytest.param("a" * (MAX_REQUEST_ID + 1), None, id="too-long"),
        pytest.param("\udcff" * 8000, None, id="raw-0xff-bytes"),
        pytest.param("abc def", None, id="space"),
        pytest.param("abc\x7f", None, id="control"),
        pytest.param("caf\u00e9", None, id="non-ascii"),
        pytest.param("", None, id="empty"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_accepted_request_id(value: str | None, expected: str | None) -> None:
    """Visible ASCII, 1-128 characters, or the sidecar mints its own."""
    assert accepted_request_id(value) == expected
