"""A module's logger: what structlog's would write, its methods kept only where structlog caches."""

from __future__ import annotations

import io
import json

import structlog
from structlog.testing import capture_logs

from sidecar.entry.logs import configure_logging
from sidecar.telemetry.module_log import ModuleLogger


def _events(written: io.StringIO) -> list[tuple[object, object]]:
    lines = [json.loads(line) for line in written.getvalue().splitlines()]
    return [(line["event"], line.get("level")) for line in lines]


def test_a_module_logger_writes_at_its_level_and_above_as_serve_configures_it() -> None:
    """Configured as serve does (cache=True, level warning): info is dropped, warning written
    with its fields, each time, and the kept method is the one used from then on."""
    written = io.StringIO()
    configure_logging("warning", stream=written, cache=True)
    log = ModuleLogger("test.module_log.serve")
    try:
        for _ in range(2):
            log.info("dropped", n=1)
            log.warning("kept", n=2)
        kept = log.warning
    finally:
        structlog.reset_defaults()
    assert _events(written) == [("kept", "warning"), ("kept", "warning")]
    assert log.warning is kept  # not handed out anew on each call


def test_a_module_logger_follows_each_reconfiguration_where_structlog_does_not_cache() -> None:
    """As the tests configure it (cache=False), capture_logs sees its lines, and after it the
    configured stream does again: nothing was kept from the first configuration."""
    written = io.StringIO()
    configure_logging("info", stream=written)
    log = ModuleLogger("test.module_log.tests")
    try:
        log.info("before")
        with capture_logs() as captured:
            log.info("captured", n=1)
        configure_logging("info", stream=written)
        log.info("after")
    finally:
        structlog.reset_defaults()
    assert [(c["event"], c.get("n")) for c in captured] == [("captured", 1)]
    assert _events(written) == [("before", "info"), ("after", "info")]


def test_a_module_logger_kept_under_caching_is_not_moved_by_a_later_configuration() -> None:
    """Where structlog caches (serve never reconfigures), a method once used stays bound to the
    configuration it was first used under, as structlog's own cached loggers do."""
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", stream=first, cache=True)
    log = ModuleLogger("test.module_log.kept")
    try:
        log.info("one")
        configure_logging("info", stream=second, cache=True)
        log.info("two")
    finally:
        structlog.reset_defaults()
    assert _events(first) == [("one", "info"), ("two", "info")]
    assert second.getvalue() == ""
