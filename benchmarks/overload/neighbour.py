"""A busy neighbour for the sidecar's CPU quota (``OVERLOAD_NEIGHBOUR=1``): a process that
spins on a core as another container's work would, allocating, hashing and asking the kernel
for fresh bytes, until it is stopped or the benchmark that started it is gone.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

CHUNK_BYTES = 64 * 1024  # a fresh buffer a round: allocation and a getrandom() syscall


def spin(parent: int, getppid: Callable[[], int] = os.getppid) -> int:
    """Busy rounds until this process's parent is no longer ``parent`` (it died and the process
    was handed to another): a neighbour never outlives its benchmark. Returns the rounds."""
    rounds = 0
    while getppid() == parent:
        hashlib.sha256(bytearray(os.urandom(CHUNK_BYTES))).digest()
        rounds += 1
    return rounds


if __name__ == "__main__":
    spin(os.getppid())
