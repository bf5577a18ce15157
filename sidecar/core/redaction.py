"""Secrets kept out of what the sidecar shows (logs, /capacity, error text): a URL's userinfo
and the values of key-like query parameters, replaced by ``[redacted]`` (pure, no I/O)."""

from __future__ import annotations

import re

REDACTED = "[redacted]"
# ``scheme://user:password@host``: everything from ``://`` to the last ``@`` before the path
# (a password may hold a raw ``@``; urlsplit splits at the last one too).
_USERINFO = re.compile(r"(?<=://)[^/?#\s]*@")
# ``?api_key=...``, ``&access_token=...``, ``;password=...``: the value up to the next separator.
_KEY_LIKE = re.compile(
    r"(?i)(?<=[?&;])((?:[\w.-]*?)(?:key|token|secret|password|passwd|auth)[\w.-]*=)[^&#;\s]*"
)


def redact_url(text: str) -> str:
    """``text`` (a URL, or text quoting URLs) with every userinfo and key-like query value
    replaced; everything else as it was."""
    return _KEY_LIKE.sub(rf"\1{REDACTED}", _USERINFO.sub(f"{REDACTED}@", text))
