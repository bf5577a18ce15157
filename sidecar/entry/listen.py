"""Opening a port: bind up front (so a clash or a bad host is one clear ConfigError), check that the
connection cap leaves descriptors for the admin port and the engine, and serve on it
(sidecar.edge.http.server)."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Callable

from sidecar.core.errors import ConfigError
from sidecar.core.outcomes import EdgeFault
from sidecar.edge.http.limits import EdgeLimits
from sidecar.edge.http.server import Handler, HttpServer

# Descriptors kept back from the proxy port's cap: the admin port, engine connections, logs.
FD_MARGIN = 128
# Handlers get this long at shutdown; the drain has already ended or stopped every stream by then.
SHUTDOWN_TIMEOUT_S = 0.5


def bind(host: str, port: int, prefix: str = "") -> socket.socket:
    """A listening socket on ``host:port``; ConfigError naming SIDECAR_{prefix}HOST/PORT if not."""
    try:
        family, *_, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ConfigError(f"SIDECAR_{prefix}HOST {host!r} does not resolve: {exc}") from exc
    try:
        return socket.create_server(address[:2], family=family, backlog=1024)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {host}:{port} (SIDECAR_{prefix}PORT): {exc.strerror or exc}"
        ) from exc


def reserve_descriptors(max_connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE as far as needed and allowed; ConfigError if the cap
    (SIDECAR_MAX_CONNECTIONS) plus the margin still does not fit. Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max_connections + FD_MARGIN
    if soft < needed and (hard == resource.RLIM_INFINITY or hard > soft):
        soft = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft < needed:
        raise ConfigError(
            f"SIDECAR_MAX_CONNECTIONS={max_connections} needs {needed} file descriptors "
            f"({FD_MARGIN} kept for the admin port and the engine) but RLIMIT_NOFILE is {soft}"
        )
    return soft


async def serve(
    handler: Handler,
    sock: socket.socket,
    limits: EdgeLimits,
    *,
    max_body_bytes: int,
    refused: Callable[[EdgeFault], None] = lambda _fault: None,
    clock: Callable[[], float] = time.monotonic,
) -> HttpServer:
    """Serve ``handler`` (the proxy port's, or the admin port's) on ``sock`` behind ``limits``;
    ``refused`` hears of every refusal at the door."""
    server = HttpServer(
        handler, limits, max_body_bytes=max_body_bytes, refused=refused, clock=clock
    )
    await server.start(sock)
    return server
