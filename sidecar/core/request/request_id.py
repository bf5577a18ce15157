"""A request's id as the sidecar carries it to the engine, into its logs and back to the client: the
client's own where it is a token a header and a log line can hold, else None, and the sidecar
mints one (pure, no I/O)."""

from __future__ import annotations

import re

MAX_REQUEST_ID = 128
# Visible ASCII (RFC 9110's VCHAR, no spaces): a UUID, a W3C trace id, a ULID, Envoy's own.
_VISIBLE = re.compile(rf"[!-~]{{1,{MAX_REQUEST_ID}}}")


def accepted_request_id(value: str | None) -> str | None:
    """``value`` where it is 1-128 visible ASCII characters; None (mint one) otherwise."""
    if value is None or not _VISIBLE.fullmatch(value):
        return None
    return value
