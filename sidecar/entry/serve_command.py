"""``sidecar serve``: run the sidecar until SIGTERM/SIGINT, then drain and exit 0."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal

import structlog

from sidecar.entry.app import SidecarServer
from sidecar.entry.event_loop import loop_factory
from sidecar.entry.logs import configure_logging, loop_exception_handler
from sidecar.entry.settings import Settings, load_settings
from sidecar.entry.settings_reference import help_text, setting_rows

log = structlog.get_logger("sidecar")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the sidecar: a proxy port for clients, an admin port for /capacity and /metrics.\n"
        "Every setting comes from a SIDECAR_* environment variable; there are no flags."
    )
    parser.epilog = help_text(setting_rows())


def run(_args: argparse.Namespace) -> int:
    settings = load_settings(os.environ)
    factory = loop_factory(settings.event_loop)
    configure_logging(settings.log_level, cache=True)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(serve(settings))


# Container objects allocated (net of those freed) between young collections; CPython's 700
# made ~25 collections a second at 64-256 streams, each walking every live stream's objects.
YOUNG_THRESHOLD = 10_000


def tune_collector() -> None:
    """Once the ports listen: put what is alive (modules, settings, the app: ~60,000 objects)
    out of the garbage collector's reach, and collect the young generation less often.

    A full collection under load walks the start-up heap, a stall of every stream at once; and
    young collections run less often at this threshold, none longer. Only cyclic garbage waits
    longer: a few MiB at most.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


async def serve(settings: Settings) -> int:
    """Start, wait for a stop signal, drain within the grace period, stop."""
    server = SidecarServer(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(loop_exception_handler())
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await server.start()
        tune_collector()
        await stop.wait()
        log.info("shutdown_requested")
        await server.drain(settings.drain_grace_s)
    finally:
        await server.stop()
    log.info("stopped")
    return 0
