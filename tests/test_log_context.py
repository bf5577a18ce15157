"""The request a log line belongs to: bound per task, merged only into lines written under it."""

from __future__ import annotations

import asyncio
import io
import json

import structlog

from sidecar.entry.logs import configure_logging
from sidecar.telemetry.log_context import bind_request, merge_request, unbind_request


def _lines(written: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in written.getvalue().splitlines()]


async def test_concurrent_requests_each_log_their_own_id_and_tenant() -> None:
    """Two requests interleaved on one loop: each line carries its own request's id and tenant
    (null when it has none), and a line outside any request carries neither."""
    written = io.StringIO()
    configure_logging("info", stream=written)
    log = structlog.get_logger("test")
    try:

        async def request(request_id: str, tenant: str | None) -> None:
            bound = bind_request(request_id, tenant)
            try:
                log.info("first")
                await asyncio.sleep(0)  # the other request runs in between
                log.info("second")
            finally:
                unbind_request(bound)

        await asyncio.gather(request("r1", "acme"), request("r2", None))
        log.info("outside")
    finally:
        structlog.reset_defaults()
    by_id: dict[object, list[tuple[object, object]]] = {}
    for line in _lines(written):
        tenant = line.get("tenant", "absent")  # a request without one logs tenant: null
        by_id.setdefault(line.get("request_id"), []).append((line["event"], tenant))
    assert by_id == {
        "r1": [("first", "acme"), ("second", "acme")],
        "r2": [("first", None), ("second", None)],
        None: [("outside", "absent")],
    }


def test_a_line_that_names_its_own_request_id_keeps_it() -> None:
    """The bound id fills in only what a line leaves out; with nothing bound, nothing is added."""
    bound = bind_request("bound", "acme")
    try:
        merged = merge_request(None, "info", {"event": "x", "request_id": "own"})
    finally:
        unbind_request(bound)
    assert merged == {"event": "x", "request_id": "own", "tenant": "acme"}
    assert merge_request(None, "info", {"event": "y"}) == {"event": "y"}
