"""Redaction: a URL's userinfo and key-like query values are replaced, nothing else is."""

from __future__ import annotations

import pytest

from sidecar.core.redaction import redact_url


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("http://u:pw@h:8000/v1", "http://[redacted]@h:8000/v1", id="userinfo"),
        pytest.param("https://token@h/", "https://[redacted]@h/", id="user-only"),
        pytest.param("http://u:p@ss@h/", "http://[redacted]@h/", id="raw-at-in-password"),
        pytest.param(
            "http://h/m?api_key=abc&x=1", "http://h/m?api_key=[redacted]&x=1", id="api-key-query"
        ),
        pytest.param(
            "http://h/?access_token=z#f", "http://h/?access_token=[redacted]#f", id="token-query"
        ),
        pytest.param(
            "engine at http://a:b@h:1/metrics unreachable",
            "engine at http://[redacted]@h:1/metrics unreachable",
            id="inside-text",
        ),
        pytest.param("http://h/x?model=a&n=2", "http://h/x?model=a&n=2", id="plain-query"),
        pytest.param("http://h/p@x", "http://h/p@x", id="at-in-path"),
        pytest.param("mail a@b.c", "mail a@b.c", id="not-a-url"),
    ],
)
def test_redact_url(text: str, expected: str) -> None:
    """Each secret-bearing part is replaced; the host, path and other parameters stay."""
    assert redact_url(text) == expected
