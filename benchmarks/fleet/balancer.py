"""nginx as the fleet's load balancer: the ready pods as one upstream, reloaded as they change.

Round robin (nginx's default, as a Kubernetes Service spreads connections) or ``least_conn`` (as
a gateway that picks the least busy endpoint). A pod joins when it is ready and leaves when it
starts terminating: the config is written again and ``nginx -s reload`` sent through the pid
file; the old workers finish the streams they carry. A busy answer (429/503) is passed on, not
retried on another pod (``proxy_next_upstream`` keeps its default: error, timeout).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from benchmarks.nginx_proxy import INSTALL_HINT, PREAMBLE, nginx_binary
from benchmarks.overload.servers import stop, wait_ready

CONFIG = """\
{preamble}    upstream pods {{
        {method}
{servers}
        keepalive 256;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location = /nginx-ready {{ return 200 "{generation}"; }}
        location / {{
            proxy_pass http://pods;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            client_max_body_size 16m;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""
METHODS = {"round-robin": "", "least-conn": "least_conn;"}


class Balancer:
    """One nginx whose upstream is the set of endpoints given to :meth:`serve`."""

    def __init__(self, tmp: Path, port: int, method: str) -> None:
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError(INSTALL_HINT)
        if method not in METHODS:
            raise ValueError(f"balancing {method!r}: one of {', '.join(METHODS)}")
        self.binary, self.tmp, self.port, self.method = binary, tmp, port, method
        self.config = tmp / "nginx.conf"
        self.url = f"http://127.0.0.1:{port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._generation = 0

    def _write(self, endpoints: Iterable[str]) -> None:
        # nginx wants one server at least: an empty fleet answers 502 (nobody to serve).
        hosts = sorted(endpoints) or ["127.0.0.1:9"]
        servers = "\n".join(f"        server {host} max_fails=0;" for host in hosts)
        self._generation += 1
        text = CONFIG.format(
            preamble=PREAMBLE.format(tmp=self.tmp, master=""),
            port=self.port,
            method=METHODS[self.method],
            servers=servers,
            generation=self._generation,
        )
        self.config.write_text(text)

    def start(self, endpoints: Iterable[str]) -> None:
        self.tmp.chmod(0o755)  # as root, the worker runs as nobody and must reach the temp paths
        self._write(endpoints)
        self._process = subprocess.Popen(
            [self.binary, "-p", str(self.tmp), "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=(self.tmp / "stderr.log").open("wb"),
            start_new_session=True,
        )
        wait_ready(self.url + "/nginx-ready", self._process, 10)

    def serve(self, endpoints: Iterable[str]) -> None:
        """Balance over ``endpoints`` ("host:port") from now on."""
        self._write(endpoints)
        done = subprocess.run(
            [self.binary, "-p", str(self.tmp), "-c", str(self.config), "-s", "reload"],
            check=False,
            capture_output=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"nginx -s reload: {done.stderr.decode(errors='replace')}")
        self._until_live()

    def _until_live(self, timeout_s: float = 10.0) -> None:
        """Until the workers of the new config answer (a reload is asynchronous: the old
        workers go on accepting for a moment)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/nginx-ready", timeout=2) as answer,
            ):
                if answer.read().decode() == str(self._generation):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"nginx did not load config {self._generation} in {timeout_s:g} s")

    def stop(self) -> None:
        if self._process is not None:
            stop(self._process, grace_s=5)
