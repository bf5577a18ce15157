"""A request head as llhttp hands it over, piece by piece, bounded as it grows; once complete,
checked (sidecar.edge.conformance) and made into a
:class:`~sidecar.edge.http.request.Request`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httptools
from multidict import CIMultiDict

from sidecar.edge.conformance import HeadRefusedError, check_head
from sidecar.edge.http.limits import BodyBudget, EdgeLimits
from sidecar.edge.http.request import Request, Wire


@dataclass(kw_only=True)
class Head:
    """One head being received, within the edge's bounds on its line, fields and size."""

    limits: EdgeLimits
    url: bytes = b""
    fields: list[tuple[bytes, bytes]] = field(default_factory=list)
    size: int = 0  # bytes received since it began (whole reads: an upper bound)

    def add_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.limits.max_line_size:
            raise HeadRefusedError("the request line is too long")

    def add_field(self, name: bytes, value: bytes) -> None:
        # Counted as they come, so that what one read can pile up stays bounded; measured and
        # decoded once, when the head is whole.
        if len(self.fields) >= self.limits.max_headers:
            raise HeadRefusedError("too many header fields")
        self.fields.append((name, value))

    def headers(self) -> CIMultiDict[str]:
        decoded = []
        for name, value in self.fields:
            if len(name) + len(value) > self.limits.max_field_size:
                raise HeadRefusedError("a header field is too long")
            decoded.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))
        return CIMultiDict(decoded)

    def request(
        self,
        parser: httptools.HttpRequestParser,
        transport: asyncio.Transport,
        wire: Wire,
        max_body_bytes: int,
        *,
        budget: BodyBudget,
        client: str,
    ) -> Request:
        """The complete head as a Request; HeadRefusedError where it breaks a rule."""
        headers = self.headers()
        checked = check_head(
            parser.get_http_version(),
            self.url.decode("utf-8", "surrogateescape"),
            headers,
            keep_alive=parser.should_keep_alive(),
            upgrade=parser.should_upgrade(),
        )
        request = Request(
            parser.get_method().decode("ascii"),
            checked.target,
            checked.version,
            headers,
            transport=transport,
            wire=wire,
            client_max_size=max_body_bytes,
            keep_alive=checked.keep_alive,
            body_exists=checked.body_exists,
            budget=budget,
            client=client,
        )
        declared = headers.get("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            request.fail("too_large")  # refused at once: no 100 Continue, no wait for the body
        return request
