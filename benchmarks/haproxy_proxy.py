"""HAProxy as a second C reference proxy: a config written into a temp dir, run in the foreground.

One thread and 8,192 connections (as nginx runs one worker of ``worker_connections 8192``),
round-robin to the engine (one server). The defaults' mode and timeouts are those Debian ships
in ``/etc/haproxy/haproxy.cfg``: ``timeout connect 5000``, ``timeout client 50000``, ``timeout
server 50000``, and no ``timeout http-request``, so a request's head and body have the client
timeout, 50 s; its logging, chroot, user and stats socket are left out. Started as a subprocess
(``-db``: not a daemon) and stopped by its PID.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

INSTALL_HINT = "haproxy not found; install it with: apt-get install -y haproxy"

CONFIG = """\
global
    maxconn 8192
    nbthread 1

defaults
    mode http
    maxconn 8192
    timeout connect 5000
    timeout client 50000
    timeout server 50000

frontend proxy
    bind 127.0.0.1:{port}
    default_backend engine

backend engine
    balance roundrobin
    server engine 127.0.0.1:{engine_port}
"""


def haproxy_binary() -> str | None:
    """The haproxy executable, also where /usr/sbin is not on PATH; None when not installed."""
    found = shutil.which("haproxy")
    if found is None and Path("/usr/sbin/haproxy").exists():
        found = "/usr/sbin/haproxy"
    return found


def start_haproxy(binary: str, tmp: Path, port: int, engine_port: int) -> subprocess.Popen[bytes]:
    """Write the config into ``tmp`` and start haproxy on ``port`` in front of ``engine_port``."""
    config = tmp / "haproxy.cfg"
    config.write_text(CONFIG.format(port=port, engine_port=engine_port))
    return subprocess.Popen(
        [binary, "-db", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "stderr.log").open("wb"),
    )
