"""Request bodies in 1-byte TCP segments: ``python -m benchmarks.segment_flood HOST PORT
CONNECTIONS SECONDS``.

Each connection sends a POST head declaring a 1 MiB ``Content-Length``, then its body one byte per
``send()`` with Nagle off (TCP_NODELAY), round-robin over the connections as fast as this one
process can, each at most ``SEGMENT_RATE`` bytes a second (0: no limit). A connection the server
answers or closes is counted by its status and opened again, at most ``OPEN_PER_ROUND`` a round
(slowhttptest's ``-r``). Prints one JSON line: segments sent, connections opened and open at
most, answers by status, the process's own CPU seconds.
"""

from __future__ import annotations

import collections
import json
import os
import socket
import sys
import time

BODY_BYTES = 1 << 20
HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % BODY_BYTES
)
OPEN_PER_ROUND = 200
# Rounds between looks for an answer (a recv on every socket): a look costs a syscall each.
LOOK_EVERY = 64
SEGMENT_RATE = float(os.environ.get("SEGMENT_RATE", "0"))


def _open(host: str, port: int) -> socket.socket | None:
    sock = socket.socket()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(1.0)
    try:
        sock.connect((host, port))
        sock.sendall(HEAD)
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def _answer(sock: socket.socket) -> str | None:
    """The status of what the server sent, "closed" if it closed, None if nothing yet."""
    try:
        data = sock.recv(64)
    except BlockingIOError:
        return None
    except OSError:
        return "reset"
    if not data:
        return "closed"
    return data.split(b" ", 2)[1].decode(errors="replace") if data.count(b" ") >= 2 else "?"


def flood(host: str, port: int, connections: int, seconds: float) -> dict[str, object]:
    socks: list[socket.socket] = []
    answers: collections.Counter[str] = collections.Counter()
    sent = opened = rounds = most = 0
    gap = 1.0 / SEGMENT_RATE if SEGMENT_RATE > 0 else 0.0
    deadline = time.monotonic() + seconds
    while (now := time.monotonic()) < deadline:
        for _ in range(min(OPEN_PER_ROUND, connections - len(socks))):
            sock = _open(host, port)
            if sock is not None:
                socks.append(sock)
                opened += 1
        most = max(most, len(socks))
        rounds += 1
        look = rounds % LOOK_EVERY == 0
        kept = []
        for sock in socks:
            status = _answer(sock) if look else None
            if status is None:
                try:
                    sent += sock.send(b" ")
                except BlockingIOError:
                    pass
                except OSError:
                    status = "reset"
            if status is None:
                kept.append(sock)
            else:
                answers[status] += 1
                sock.close()
        socks = kept
        if gap:
            time.sleep(max(0.0, gap - (time.monotonic() - now)))
    for sock in socks:
        sock.close()
    cpu = time.process_time()
    return {
        "segments": sent,
        "opened": opened,
        "most": most,
        "answers": dict(answers),
        "cpu_s": round(cpu, 2),
    }


def main(argv: list[str]) -> int:
    host, port, connections, seconds = argv
    print(json.dumps(flood(host, int(port), int(connections), float(seconds))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
