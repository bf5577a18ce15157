"""A request body as a JSON object: strict UTF-8, the standard library's parser, and no text or
number an engine cannot take (a lone surrogate, NaN, Infinity, 1e999); every failure is a
RequestError (pure, no I/O)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from sidecar.core.errors import RequestError


def _no_constant(name: str) -> float:
    """NaN, Infinity and -Infinity are Python's extension, not JSON (RFC 8259 section 6)."""
    message = f"request body holds {name}, which JSON has no number for"
    raise RequestError(message, code="invalid_json")


def _finite(text: str) -> float:
    """A number past a double's range (1e999) would reach the engine as infinity."""
    value = float(text)
    if not math.isfinite(value):
        message = "request body holds a number too large for a double (e.g. 1e999)"
        raise RequestError(message, code="invalid_json")
    return value


# json.loads(text), with the numbers an engine cannot take refused.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)
# A \uD800-\uDFFF escape: only a body with one can hold a lone surrogate (raw UTF-8 cannot encode
# one: the strict decode refuses it), so only such bodies pay for the exact check.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; only UTF-8 (json.loads would also guess UTF-16 and UTF-32)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError("request body is not UTF-8 JSON", code="invalid_json") from exc
    try:
        body = _DECODER.decode(text)
    except RecursionError as exc:
        raise RequestError("request body is nested too deeply", code="invalid_json") from exc
    except ValueError as exc:  # JSONDecodeError, and integers past Python's digit limit
        if text.startswith("\ufeff"):  # json.loads says so; its decoder alone does not
            message = "request body starts with a byte order mark: send JSON without one"
            raise RequestError(message, code="invalid_json") from exc
        raise RequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object", code="invalid_json")
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(body)
    return body


def _refuse_lone_surrogates(body: dict[str, Any]) -> None:
    """A string with an unpaired surrogate (``"\\ud800"``) is valid JSON but no text: engines fail
    on it with a 500 (UTF-8 cannot encode it), so it is the client's error, told here."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        message = "request body holds a lone UTF-16 surrogate (e.g. \\ud800): send valid Unicode"
        raise RequestError(message, code="invalid_json") from exc
    except (RecursionError, ValueError) as exc:
        raise RequestError("request body is nested too deeply", code="invalid_json") from exc


def serialise(body: dict[str, Any]) -> bytes:
    """The body as JSON bytes again (after the checks changed it)."""
    try:
        return json.dumps(body).encode()
    except (RecursionError, ValueError) as exc:
        raise RequestError("request body is nested too deeply", code="invalid_json") from exc
