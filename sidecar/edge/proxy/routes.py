"""Where a request goes, decided on the path the engine will see (pure: no aiohttp, no I/O).

The raw request target is normalised once (percent-encoded unreserved characters decoded, repeated
slashes collapsed, dot segments removed) and that exact form is both what admission routes on and
what is forwarded. Encodings a server could read two ways (``%2F``, ``%5C``, ``%00``, a backslash,
a bad ``%`` escape) are refused rather than guessed.

Only the engine's API is forwarded: paths under ``/v1/`` and ``/health`` by default, the free
paths, and what SIDECAR_FORWARD_PATHS adds; anything else (the engine's ``/metrics``, its admin
routes) is a 404 that never reaches it. Every method that may generate (anything but GET, HEAD and
OPTIONS) passes admission: the three OpenAI generating routes priced by their token budget, any
other path at one request's price, except the configured free paths (cheap engine calls such as
``/tokenize``).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sidecar.core.errors import RequestError
from sidecar.core.request.request_checks import Endpoint

RouteKind = Literal["priced", "admitted", "free"]

PRICED: Mapping[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_FREE_PATHS = ("/tokenize", "/detokenize")
# The OpenAI API and the engine's health; an entry ending in "/" forwards everything below it.
DEFAULT_FORWARD_PATHS = ("/v1/", "/health")

_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_ESCAPE = re.compile(r"%(.{0,2})", re.DOTALL)
_HEX = frozenset(string.hexdigits)
_FORBIDDEN_BYTES = frozenset({0x2F, 0x5C, 0x25})  # '/', '\' and '%' itself: two readings


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """A request's destination: the normalised path, the raw query and how it is admitted."""

    path: str
    query: str
    kind: RouteKind
    endpoint: Endpoint | None = None

    @property
    def path_qs(self) -> str:
        """What is forwarded to the engine: exactly the path that was admitted."""
        return f"{self.path}?{self.query}" if self.query else self.path


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyPaths:
    """Which paths reach the engine at all (``forwarded``: exact paths, and prefixes ending in
    '/'), and which of them need no permit whatever the method (``free``)."""

    free: frozenset[str] = frozenset(DEFAULT_FREE_PATHS)
    forwarded: tuple[str, ...] = DEFAULT_FORWARD_PATHS

    def reach(self, path: str) -> bool:
        """Whether the normalised ``path`` may reach the engine: a free path, or a forwarded
        one."""
        return path in self.free or any(
            path.startswith(entry) if entry.endswith("/") else path == entry
            for entry in self.forwarded
        )


def route(method: str, raw_target: str, paths: ProxyPaths) -> Target:
    """The target of ``method raw_target``; RequestError 400 for an ambiguous spelling, 404 for a
    path the engine is not reached on."""
    raw_path, _, query = raw_target.partition("?")
    path = normalise_path(raw_path)
    if not paths.reach(path):
        raise RequestError(
            f"{path} is not served on this port", status=404, param="path", code="not_found"
        )
    if method.upper() in SAFE_METHODS or path in paths.free:
        return Target(path=path, query=query, kind="free")
    endpoint = PRICED.get(path)
    if endpoint is not None and method.upper() == "POST":
        return Target(path=path, query=query, kind="priced", endpoint=endpoint)
    return Target(path=path, query=query, kind="admitted")


def normalise_path(raw_path: str) -> str:
    """The one spelling of ``raw_path``: RFC 3986 §6.2.2 normalisation plus collapsed slashes."""
    if not raw_path.startswith("/") or "\\" in raw_path or "#" in raw_path:
        raise _ambiguous("the request path must be an absolute path without '\\' or '#'")
    decoded = _ESCAPE.sub(_decode_escape, raw_path)
    segments: list[str] = []
    for segment in decoded.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    path = "/" + "/".join(segments)
    last = decoded.rsplit("/", 1)[-1]
    if segments and last in ("", ".", ".."):
        path += "/"
    return path


def _decode_escape(match: re.Match[str]) -> str:
    digits = match.group(1)
    if len(digits) != 2 or not set(digits) <= _HEX:
        raise _ambiguous("the request path has a malformed percent-escape")
    value = int(digits, 16)
    if value in _FORBIDDEN_BYTES or value < 0x20 or value == 0x7F:
        raise _ambiguous(f"the request path encodes %{digits.upper()}, which is ambiguous")
    char = chr(value)
    return char if char in _UNRESERVED else f"%{digits.upper()}"


def _ambiguous(message: str) -> RequestError:
    return RequestError(message, param="path", code="ambiguous_path")


def parse_free_paths(spec: str) -> frozenset[str]:
    """SIDECAR_FREE_PATHS: comma-separated paths, each normalised like a request's."""
    return frozenset(normalise_path(part.strip()) for part in spec.split(",") if part.strip())


def parse_forward_paths(spec: str) -> tuple[str, ...]:
    """SIDECAR_FORWARD_PATHS: comma-separated paths, each normalised like a request's; a trailing
    "/" forwards everything below."""
    return tuple(normalise_path(part.strip()) for part in spec.split(",") if part.strip())
