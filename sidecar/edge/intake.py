"""The work done before admission: reading the body (bounded in size and time), checking it and,
where configured, counting its prompt at the engine. All of it runs inside the edge's Gate, so
only so many requests are ever buffered and parsed at once."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from sidecar.core.errors import EdgeRefusedError, RequestError
from sidecar.core.request_checks import (
    CheckedRequest,
    Endpoint,
    TokenPolicy,
    check_request,
    enforce_prompt_budget,
    with_prompt_tokens,
)
from sidecar.edge.prompt_count import EnginePromptCounter
from sidecar.edge.request import Request


async def read_body(request: Request, timeout_s: float) -> bytes:
    """The whole body, within the size limit and ``timeout_s``; RequestError/EdgeRefusedError."""
    expect = request.headers.get("Expect")
    if expect is not None:
        _check_expectation(expect)
    if request.complete or request.fault is not None:  # read() cannot wait: no timer
        return await request.read()
    try:
        async with asyncio.timeout(timeout_s):
            # Only now, once the request was routed and let through the gate, so a refused one
            # never makes its client send the body.
            if expect is not None and request.version >= (1, 1):
                request.send_continue()
            return await request.read()
    except TimeoutError as exc:
        raise EdgeRefusedError("body_timeout") from exc


def _check_expectation(expect: str) -> None:
    if expect.strip().lower() != "100-continue":  # never echoed: it is the client's text
        raise RequestError(
            "the only expectation this server meets is Expect: 100-continue",
            status=417,
            code="expectation_failed",
        )


def require_json(request: Request) -> None:
    """A priced request's body must be UTF-8 JSON: a declared other charset is a 415.

    The media type itself is not enforced (``curl -d`` sends a form type with a JSON body); the
    bytes are: check_request refuses any body that is not UTF-8 JSON.
    """
    charset = request.charset
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        raise RequestError(
            "the request body must be JSON in UTF-8 (Content-Type: application/json)",
            status=415,
            code="unsupported_media_type",
        )


async def checked_request(
    request: Request,
    endpoint: Endpoint,
    budget: TokenPolicy,
    *,
    body_timeout_s: float,
    counter: EnginePromptCounter | None,
    headers: Mapping[str, str],
) -> CheckedRequest:
    """The request, validated and budgeted; its prompt counted by the engine where configured."""
    require_json(request)
    checked = check_request(await read_body(request, body_timeout_s), endpoint, budget)
    if checked.tokenize is None or counter is None:
        return checked
    tokens = await counter.count(checked.tokenize, headers)
    if tokens is None:  # the engine could not say: the estimate prices it, and bounds it
        enforce_prompt_budget(checked.prompt_tokens, checked.prompt_param, budget)
        return checked
    return with_prompt_tokens(checked, tokens, budget)
