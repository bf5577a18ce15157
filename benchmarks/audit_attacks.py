"""Issue 48's five attacks, as one process: ``python -m benchmarks.audit_attacks ROW HOST PORT
SCALE SECONDS``.

Each of a row's connections, from its own loopback address, lives one attack (the socket's
receive buffer 4 KiB, as a client that does not read keeps it) and is opened again once the
sidecar ends it, until SECONDS are up; the connections open over the first RAMP_S. SCALE
multiplies every width (connections, requests pipelined). Prints one JSON line: connections
opened and open at most, how each ended (the answer's status where the attack reads one), the
process's own CPU seconds.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import resource
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from benchmarks import hostile_requests
from emulator.config import EmulatorConfig

ATTACKER, SECOND_ATTACKER = "127.0.0.2", "127.0.0.3"
MODEL = EmulatorConfig().model_name
RAMP_S = 2.0
RECEIVE_BUFFER = 4096
TRICKLE_EVERY_S, TRICKLE_BYTES = 0.5, 300  # 600 B/s, above the sidecar's 500 B/s floor
SLOW_BODY_BYTES = 16_000
SLOW_READ_EVERY_S, SLOW_READ_BYTES = 1.0, 64
LONG_ANSWER_TOKENS = 1_500  # a streamed chat of ~300 kB from the emulator
TINY_CHUNKED_BYTES = 4 << 20
TCP_ESTABLISHED = 1


@dataclass(frozen=True)
class Row:
    """One row of the audit: its attack and its full width."""

    name: str
    addresses: tuple[str, ...]
    connections: int  # from each address
    pipelined: int = 0  # requests each connection pipelines

    def width(self, scale: float) -> tuple[int, int]:
        """Connections from each address, and requests pipelined on each, at ``scale``."""
        return max(1, round(self.connections * scale)), max(1, round(self.pipelined * scale))


ROWS = {
    1: Row("pipelined GETs, never read", (ATTACKER,), 100, 20_000),
    2: Row("pipelined streamed chats, never read", (ATTACKER,), 100, 2_000),
    3: Row("slow readers of a ~300 kB answer", (ATTACKER, SECOND_ATTACKER), 2_048),
    4: Row("16 kB bodies at 600 B/s", (ATTACKER, SECOND_ATTACKER), 2_048),
    5: Row("4 MiB bodies in 2-byte chunks", (ATTACKER,), 16),
}


@dataclass
class Tally:
    """What the attack's connections did."""

    opened: int = 0
    open_now: int = 0
    most: int = 0
    ended: collections.Counter[str] = field(default_factory=collections.Counter)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        self.opened += 1
        self.open_now += 1
        self.most = max(self.most, self.open_now)
        try:
            yield
        finally:
            self.open_now -= 1


Life = Callable[[socket.socket], Awaitable[str]]


def status_of(data: bytes) -> str:
    """The status of an answer's first bytes; "closed" for none."""
    if not data:
        return "closed"
    parts = data.split(b" ", 2)
    return parts[1].decode(errors="replace") if len(parts) > 2 else "?"


def peek(sock: socket.socket, size: int) -> bytes | None:
    """Up to ``size`` bytes the sidecar sent, b"" at its end, None if nothing has come."""
    try:
        return sock.recv(size)
    except BlockingIOError:
        return None
    except OSError:
        return b""


async def never_reads(sock: socket.socket, burst: bytes) -> str:
    """Send the whole pipelined burst, never read, hold it until the sidecar ends it."""
    try:
        await asyncio.get_running_loop().sock_sendall(sock, burst)
    except OSError:
        return "reset"
    while True:  # the state, not a read: a read would make room for more answers
        if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != TCP_ESTABLISHED:
            return "closed"
        await asyncio.sleep(0.5)


async def reads_slowly(sock: socket.socket, request: bytes) -> str:
    """Ask for a long answer, then read SLOW_READ_BYTES of it every SLOW_READ_EVERY_S."""
    await asyncio.get_running_loop().sock_sendall(sock, request)
    status = ""
    while True:
        await asyncio.sleep(SLOW_READ_EVERY_S)
        data = peek(sock, SLOW_READ_BYTES)
        if data == b"":
            return status or "closed"
        if data and not status:
            status = status_of(data)


async def trickles(sock: socket.socket, head: bytes, body: bytes) -> str:
    """Send the head, then TRICKLE_BYTES of the body every TRICKLE_EVERY_S; its answer read."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, head)
    for at in range(0, len(body), TRICKLE_BYTES):
        if (data := peek(sock, 64)) is not None:
            return status_of(data)
        await loop.sock_sendall(sock, body[at : at + TRICKLE_BYTES])
        await asyncio.sleep(TRICKLE_EVERY_S)
    return status_of(await loop.sock_recv(sock, 64))


async def floods(sock: socket.socket, data: bytes) -> str:
    """Send it all as fast as the sidecar takes it; its answer read."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError):
        await loop.sock_sendall(sock, data)
    try:
        async with asyncio.timeout(5):
            return status_of(await loop.sock_recv(sock, 64))
    except OSError:  # TimeoutError among them
        return "reset"


def life_of(row: int, pipelined: int) -> Life:
    """What each connection of ``row`` does once opened."""
    if row in (1, 2):
        make = (
            hostile_requests.get
            if row == 1
            else functools.partial(hostile_requests.chat, model=MODEL)
        )
        burst = b"".join(make(i) for i in range(pipelined))
        return lambda sock: never_reads(sock, burst)
    if row == 3:
        request = hostile_requests.chat(0, MODEL, LONG_ANSWER_TOKENS)
        return lambda sock: reads_slowly(sock, request)
    if row == 4:
        head = hostile_requests.completion_head(SLOW_BODY_BYTES)
        bare = len(hostile_requests.completion(0, MODEL))
        body = hostile_requests.completion(SLOW_BODY_BYTES - bare, MODEL)
        return lambda sock: trickles(sock, head, body)
    padded = hostile_requests.completion(TINY_CHUNKED_BYTES, MODEL)
    data = hostile_requests.CHUNKED_HEAD + hostile_requests.chunked(padded, 2)
    return lambda sock: floods(sock, data)


async def connected(address: str, target: tuple[str, int]) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.bind((address, 0))
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, target)
    except BaseException:
        sock.close()
        raise
    return sock


async def connection(
    address: str, target: tuple[str, int], life: Life, tally: Tally, deadline: float
) -> None:
    """One of the attack's connections, opened again each time it ends, until the deadline: read
    here too, as a cancellation racing a finishing await can be lost."""
    while time.monotonic() < deadline:
        try:
            sock = await connected(address, target)
        except OSError:
            tally.ended["not connected"] += 1
            await asyncio.sleep(0.1)
            continue
        with sock, tally.holding():
            try:
                tally.ended[await life(sock)] += 1
            except OSError:
                tally.ended["reset"] += 1


async def attack(row: int, target: tuple[str, int], scale: float, seconds: float) -> Tally:
    spec = ROWS[row]
    per_address, pipelined = spec.width(scale)
    life = life_of(row, pipelined)
    tally = Tally()
    slots = [address for address in spec.addresses for _ in range(per_address)]
    deadline = time.monotonic() + seconds

    async def staggered(k: int, address: str) -> None:
        await asyncio.sleep(k * RAMP_S / len(slots))
        await connection(address, target, life, tally, deadline)

    tasks = [asyncio.create_task(staggered(k, a)) for k, a in enumerate(slots)]
    await asyncio.sleep(seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return tally


def main(argv: list[str]) -> int:
    row, host, port, scale, seconds = argv
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tally = asyncio.run(attack(int(row), (host, int(port)), float(scale), float(seconds)))
    count = {"opened": tally.opened, "most": tally.most, "ended": dict(tally.ended)}
    print(json.dumps({**count, "cpu_s": round(time.process_time(), 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
