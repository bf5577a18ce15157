"""Logs: secrets redacted by key and inside text; library records and loop errors become one
rate-limited JSON event per kind, without tracebacks."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import logging
import re
import time
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from sidecar.entry.logs import (
    OncePer,
    _scrub,
    configure_logging,
    loop_exception_handler,
    may_hold_secret,
    redact_secrets,
)


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """configure_logging is global: put structlog and the root logger back afterwards."""
    handlers = logging.getLogger().handlers[:]
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers[:] = handlers


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        pytest.param({"authorization": "Bearer x"}, {"authorization": "[redacted]"}, id="key"),
        pytest.param({"x_api_key": "abc"}, {"x_api_key": "[redacted]"}, id="key-substring"),
        pytest.param({"value": "sk-abcdef123"}, {"value": "[redacted]"}, id="prefix"),
        pytest.param(
            {"error": "bad line b'Authorization: Bearer sk-123456789'"},
            {"error": "bad line b'Authorization: [redacted]"},
            id="inside-text",
        ),
        pytest.param(
            {"msg": "token bearer abc.def ok"}, {"msg": "token [redacted] ok"}, id="bearer"
        ),
        pytest.param({"path": "/v1/models"}, {"path": "/v1/models"}, id="untouched"),
        pytest.param({"note": "ſk-abcdefgh"}, {"note": "[redacted]"}, id="unicode-case"),
        pytest.param(
            {"upstream": "http://u:pw@h:1"}, {"upstream": "http://[redacted]@h:1"}, id="userinfo"
        ),
        pytest.param(
            {"error": "GET http://h/m?token=abc failed"},
            {"error": "GET http://h/m?token=[redacted] failed"},
            id="query-token",
        ),
    ],
)
def test_secrets_are_redacted(event: dict[str, str], expected: dict[str, str]) -> None:
    """Each secret-bearing value is replaced; everything else is left as it was."""
    assert dict(redact_secrets(None, "info", dict(event))) == expected


@given(
    st.text(max_size=80)
    | st.builds(
        "".join,
        st.lists(
            st.sampled_from(
                [
                    "Authorization: ",
                    "api_key=",
                    "Cookie:",
                    "bearer ",
                    "sk-",
                    "SK-abcdefg",
                    "ſk-abcdefg",
                    "authorızation: x",
                    "x",
                    " ",
                    "http://",
                    "u:p@",
                    "?token=",
                    "&KEY=",
                    "/",
                ]
            ),
            max_size=6,
        ),
    )
)
def test_text_passed_over_holds_nothing_to_scrub(text: str) -> None:
    """The fast check skips only text the scrubbing pattern leaves as it is."""
    if not may_hold_secret(text):
        assert _scrub(text) == text


def test_once_per_interval_counts_what_it_held_back() -> None:
    """The first event passes; repeats inside the interval are held, then counted."""
    clock = Clock()
    once = OncePer(10.0, clock)
    assert once.allow("k") == 0
    assert once.allow("k") is None
    assert once.allow("k") is None
    clock.now = 10.5
    assert once.allow("k") == 2


def test_library_records_become_json_without_tracebacks() -> None:
    """An aiohttp-style exception record is one JSON line: no traceback, no secret."""
    out = io.StringIO()
    configure_logging("info", stream=out)
    logger = logging.getLogger("aiohttp.server")
    error = ValueError("Authorization: Bearer sk-secret-secret")
    for _ in range(3):
        logger.error(
            "Error handling request Authorization: Bearer sk-secret-secret",
            exc_info=(ValueError, error, None),
        )
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert (event["event"], event["error"]) == ("library_log", "ValueError")
    assert "sk-secret" not in lines[0]
    assert "Traceback" not in lines[0]


def test_library_records_show_their_arguments() -> None:
    """aiohttp's "Error handling request from %s" reads with the peer filled in, not a bare %s."""
    out = io.StringIO()
    configure_logging("info", stream=out)
    logging.getLogger("aiohttp.server").error("Error handling request from %s", "127.0.0.1")
    event = json.loads(out.getvalue().splitlines()[0])
    assert event["message"] == "Error handling request from 127.0.0.1"


async def test_accept_errors_are_logged_once_per_interval() -> None:
    """A flood of accept() failures at the descriptor limit is one JSON event, then a count."""
    out = io.StringIO()
    configure_logging("info", stream=out)
    clock = Clock()
    handler = loop_exception_handler(OncePer(10.0, clock))
    loop = asyncio.get_running_loop()
    context = {"message": "socket.accept() out of system resource", "exception": OSError(24, "x")}
    for _ in range(1000):
        handler(loop, context)
    clock.now = 11
    handler(loop, context)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["repeated"] for e in events] == [0, 999]
    assert {e["event"] for e in events} == {"loop_error"}


def test_a_line_is_json_with_its_time_and_no_secret_even_in_a_traceback() -> None:
    """An operator's line: the event, a UTC timestamp to the microsecond, values JSON cannot
    carry as their repr, and a traceback whose text is scrubbed like any other."""
    out = io.StringIO()
    configure_logging("info", stream=out)
    log = structlog.get_logger("sidecar.test")

    class Opaque:
        def __repr__(self) -> str:
            return "Opaque()"

    def fail() -> None:
        raise ValueError("the engine said Authorization: Bearer sk-secret-secret")

    try:
        fail()
    except ValueError:
        log.exception("proxy_handler_failed", thing=Opaque())
    event = json.loads(out.getvalue())
    assert (event["event"], event["level"], event["thing"]) == (
        "proxy_handler_failed",
        "error",
        "Opaque()",
    )
    # ISO 8601 in UTC; datetime.isoformat() leaves out a fraction of exactly .000000
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z", event["timestamp"])
    stamped = datetime.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
    assert abs(stamped.timestamp() - time.time()) < 60
    assert "ValueError" in event["exception"]
    assert "sk-secret" not in out.getvalue()
