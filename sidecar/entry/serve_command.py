"""``sidecar serve``: run the sidecar until SIGTERM/SIGINT, then drain and exit 0."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal

import structlog

from sidecar.entry.app import SidecarServer
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
    configure_logging(settings.log_level, cache=True)
    return asyncio.run(serve(settings))


def freeze_startup_heap() -> None:
    """Put what is alive once the ports listen (modules, settings, the app: ~60,000 objects) out
    of the garbage collector's reach. A full collection under load scanned them all in ~40 ms, a
    stall of every stream at once (docs/performance.md); they live as long as the process."""
    gc.collect()
    gc.freeze()


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
        freeze_startup_heap()
        await stop.wait()
        log.info("shutdown_requested")
        await server.drain(settings.drain_grace_s)
    finally:
        await server.stop()
    log.info("stopped")
    return 0
