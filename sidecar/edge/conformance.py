"""The HTTP/1.1 rules a head must meet here, beyond the syntax llhttp's strict mode already
enforces, in one place, each with its RFC section: those of a client's request head, and the
transfer-coding rule an engine's answer head meets too (:mod:`sidecar.edge.engine.head`). Pure: a
parsed head in, a decision out or :class:`HeadRefusedError` (a 400 that echoes nothing)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from multidict import CIMultiDict

VERSIONS = {"1.1": (1, 1), "1.0": (1, 0)}

# RFC 9110 §7.2 and RFC 3986 §3.2.2: uri-host [ ":" port ], where uri-host is an IP-literal in
# brackets or a reg-name (IPv4 addresses are reg-names here). Empty is valid (RFC 9110 §7.2).
_HOST = re.compile(r"(\[[0-9A-Za-z:._~!$&'()*+,;=-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(:[0-9]*)?")


class HeadRefusedError(Exception):
    """A head past the edge's bounds, or one this server does not take."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedHead:
    """What the rules decide about a head that passes them."""

    version: tuple[int, int]
    target: str  # the request-target as it is routed and forwarded
    body_exists: bool
    keep_alive: bool  # the connection may carry another request after this one


def check_head(
    version_text: str, url: str, headers: CIMultiDict[str], *, keep_alive: bool, upgrade: bool
) -> CheckedHead:
    """Apply every rule to a head llhttp accepted; HeadRefusedError for the first it breaks.

    ``keep_alive`` is llhttp's reading of the version and the Connection field; ``upgrade`` that
    the client asked to switch protocols."""
    version = VERSIONS.get(version_text)
    if version is None:  # RFC 9112 §2.3: this is an HTTP/1.x server; HTTP/0.9 has no head
        raise HeadRefusedError("only HTTP/1.0 and HTTP/1.1 are served")
    _check_host(version, headers.getall("Host", []))
    chunked = "Transfer-Encoding" in headers
    if chunked and not chunked_alone(headers.getall("Transfer-Encoding")):
        # RFC 9112 §6.1: chunked must be the final coding, and a coding not understood is
        # refused. llhttp takes `gzip, chunked` and undoes only the chunking: the body would go
        # on still coded, with nothing saying so.
        raise HeadRefusedError("a transfer coding other than chunked")
    body_exists = chunked or headers.get("Content-Length", "0") != "0"
    if body_exists and upgrade:
        # llhttp would hand the body over as the new protocol's bytes; there is no new one here.
        raise HeadRefusedError("an Upgrade request with a body")
    if chunked and version < (1, 1):
        # RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message means the framing is faulty:
        # the message is processed, then the connection closes.
        keep_alive = False
    return CheckedHead(
        version=version,
        target=without_fragment(url),
        body_exists=body_exists,
        keep_alive=keep_alive,
    )


def _check_host(version: tuple[int, int], hosts: list[str]) -> None:
    # RFC 9112 §3.2: a 400 for an HTTP/1.1 request without Host, for any request with more than
    # one Host field line, and for a Host with an invalid value. HTTP/1.0 may omit it.
    if not hosts and version >= (1, 1):
        raise HeadRefusedError("an HTTP/1.1 request without a Host field")
    if len(hosts) > 1:
        raise HeadRefusedError("more than one Host field")
    if hosts and _HOST.fullmatch(hosts[0]) is None:
        raise HeadRefusedError("a Host field that is not a host and port")


def without_fragment(url: str) -> str:
    """The request-target without a fragment.

    RFC 9112 §3.2: the origin-form is an absolute-path and a query; a fragment (RFC 3986 §3.5,
    from the first ``#``) is not part of it, and clients do not send one. Stripped, not refused:
    uvicorn's httptools protocol, the server in front of vLLM, reads the target with llhttp's URL
    parser and drops the fragment, so what is admitted and forwarded here is what the engine
    would have read from the client's bytes anyway.
    """
    return url.partition("#")[0]


def chunked_alone(transfer_encodings: list[str]) -> bool:
    """Whether the Transfer-Encoding field lines (their values) name ``chunked`` and no other
    coding: the only one the sidecar decodes, on either side."""
    return [c.strip().lower() for v in transfer_encodings for c in v.split(",")] == ["chunked"]
