"""The request the sidecar writes to the engine, and which fields a proxy passes on (RFC 9110
§7.6.1): pure functions, no I/O. Answers are parsed by llhttp (:mod:`connection`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from multidict import CIMultiDict

from sidecar.edge.engine.errors import UnsendableRequestError
from sidecar.edge.message import UnsendableHeadError, encode_head

# Sent by the sidecar itself, whatever the client sent: the framing of the request it writes.
# Expect too: the body goes out with the head, so there is nothing for a 100 Continue to unblock.
OWN_FIELDS = frozenset({"host", "content-length", "transfer-encoding", "connection", "expect"})
# RFC 9110 §7.6.1 hop-by-hop fields, plus the framing fields each side writes anew (the proxy port's
# server toward the client, encode_request toward the engine).
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


def end_to_end(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """Headers without hop-by-hop fields (and those named in the Connection header)."""
    return CIMultiDict(end_to_end_fields(headers.items(), headers.get("Connection")))


def end_to_end_fields(
    fields: Iterable[tuple[str, str]], connection: str | None
) -> list[tuple[str, str]]:
    """``fields`` less the hop-by-hop ones and those ``connection`` (the Connection field's
    value) names, in order."""
    drop = HOP_BY_HOP
    if connection:
        drop = HOP_BY_HOP | {token.strip().lower() for token in connection.split(",")}
    return [(name, value) for name, value in fields if name.lower() not in drop]


def encode_request(
    method: str, target: str, host: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    """One request's bytes: request line, Host, the client's end-to-end fields, our framing."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() not in OWN_FIELDS]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    try:
        encoded = encode_head(lines)
    except UnsendableHeadError as exc:
        msg = "a request line or header field holds a line break"
        raise UnsendableRequestError(msg) from exc
    if b"\x00" in encoded or " " in target:
        msg = "a request line or header field holds a forbidden character"
        raise UnsendableRequestError(msg)
    return encoded + body if body else encoded
