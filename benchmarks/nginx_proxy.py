"""nginx as the C reference proxy: a generated config in a temp dir, run in the foreground.

One worker, ``proxy_buffering off`` (each upstream read is written on at once, like the sidecar),
HTTP/1.1 to the engine over kept-alive connections; the pid file, error log and temp paths all
live in the temp dir. Started as a subprocess and stopped by its PID.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

INSTALL_HINT = "nginx not found; install the reference proxy with: apt-get install -y nginx-light"

# One worker in the foreground, its pid file, logs and temp paths in ``tmp``; the ``http`` block
# left open for the caller's upstream and server.
PREAMBLE = """\
worker_processes 1;
{master}daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
"""

CONFIG = """\
{preamble}    upstream engine {{
        server 127.0.0.1:{engine_port};
        keepalive 1024;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 60s;
        }}
    }}
}}
"""


def nginx_binary() -> str | None:
    """The nginx executable, also where /usr/sbin is not on PATH; None when not installed."""
    found = shutil.which("nginx")
    if found is None and Path("/usr/sbin/nginx").exists():
        found = "/usr/sbin/nginx"
    return found


def start_nginx(
    binary: str,
    tmp: Path,
    port: int,
    engine_port: int,
    *,
    wrapper: Sequence[str] = (),
    single_process: bool = False,
) -> subprocess.Popen[bytes]:
    """Write the config into ``tmp`` and start nginx on ``port`` in front of ``engine_port``.

    ``wrapper``: a command that runs nginx (a profiler); ``single_process``: no master, the one
    process serves (``master_process off``), so that the wrapper sees all of nginx's work.
    """
    tmp.chmod(0o755)  # as root, the worker runs as nobody and must reach the temp paths
    config = tmp / "nginx.conf"
    master = "master_process off;\n" if single_process else ""
    preamble = PREAMBLE.format(tmp=tmp, master=master)
    config.write_text(CONFIG.format(preamble=preamble, port=port, engine_port=engine_port))
    return subprocess.Popen(
        [*wrapper, binary, "-p", str(tmp), "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "stderr.log").open("wb"),
    )


def worker_pids(master: int) -> list[int]:
    """The master's child processes (the worker), from /proc (Linux)."""
    children = Path(f"/proc/{master}/task/{master}/children")
    if children.exists():
        return [int(pid) for pid in children.read_text().split()]
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            found.append(int(stat.parent.name))
    return found
