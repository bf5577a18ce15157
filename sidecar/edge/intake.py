"""The work done before admission: reading the body (bounded in size and time), checking it and,
where configured, counting its prompt at the engine. All of it runs inside the edge's Gate, so
only so many requests are ever buffered and parsed at once."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp
from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError

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


async def read_body(request: web.BaseRequest, timeout_s: float) -> bytes:
    """The whole body, within the size limit and ``timeout_s``; RequestError/EdgeRefusedError."""
    expect = request.headers.get("Expect")
    try:
        if expect is not None:
            _check_expectation(expect)
        if request.content.is_eof():  # all of it arrived with the head: read() cannot wait
            return await request.read()
        async with asyncio.timeout(timeout_s):
            if expect is not None and request.version >= HttpVersion11:
                await _continue(request)
            return await request.read()
    except TimeoutError as exc:
        raise EdgeRefusedError("body_timeout") from exc
    except web.HTTPRequestEntityTooLarge as exc:
        raise RequestError(
            f"request body is larger than this server's limit of {request.client_max_size} bytes",
            status=413,
            code="body_too_large",
        ) from exc
    except (asyncio.IncompleteReadError, aiohttp.ClientPayloadError) as exc:
        raise RequestError("request body ended early", code="incomplete_body") from exc
    except HttpProcessingError as exc:  # a bad chunk size, a broken encoding: never echoed
        raise RequestError("request body is not valid HTTP/1.1 framing", code="bad_body") from exc


def _check_expectation(expect: str) -> None:
    if expect.strip().lower() != "100-continue":  # never echoed: it is the client's text
        raise RequestError(
            "the only expectation this server meets is Expect: 100-continue",
            status=417,
            code="expectation_failed",
        )


async def _continue(request: web.BaseRequest) -> None:
    """Tell a client that waits (curl does, for bodies over 1 KiB) to send its body: only now,
    once the request was routed and let through the gate, so a refused one never sends it."""
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the answer itself has not started


def require_json(request: web.BaseRequest) -> None:
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
    request: web.BaseRequest,
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
