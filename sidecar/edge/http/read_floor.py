"""A floor on what one read of a request brings: every read costs the loop the same callback, the
parser's call and a charge to the body budget, whatever it holds, so a request that arrives in
pieces no client needs (1-byte TCP segments, Nagle off) makes its connection rest: reading paused
for ``REST_S`` while the kernel gathers what it sends, read at once when the rest ends.

Past ``FREE_READS`` reads of one request (its head and body), reads that average under
``MIN_READ_BYTES`` make the connection rest after each one until the average is back over it. A
request in a few segments never counts, whatever their size; one whose segments are a byte each
costs the loop one read per ``REST_S`` (slow senders) or per ``MIN_READ_BYTES`` on average (fast
ones), and still arrives: slowed, not broken. The floor on a body's pace measures a resting
connection up to where its rest began (:meth:`sidecar.edge.proxy.intake.BodyLimits.check`), and
``REST_S`` is under the body budget's 1 s grace, so a rest never makes a body look slow or stalled.
"""

from __future__ import annotations

from dataclasses import dataclass

# Reads of any size a request may take before their average counts: a head and body in a few
# segments pass as they are, and a body over a slow link (an MSS of 1,448 bytes a read) is far
# over the floor.
FREE_READS = 16
# The least average read a longer request keeps, as MIN_CHUNK_BYTES for a chunked body's chunks.
MIN_READ_BYTES = 256
# How long a connection under the floor stops being read.
REST_S = 0.5


@dataclass(slots=True)
class ReadFloor:
    """The reads of the request being received, and their bytes."""

    reads: int = 0
    size: int = 0

    def begin(self) -> None:
        """A request begins: its reads count from none."""
        self.reads = self.size = 0

    def short(self, size: int) -> bool:
        """Count a read of ``size`` bytes: whether the reads so far are under the floor."""
        self.reads += 1
        self.size += size
        return self.reads > FREE_READS and self.size < self.reads * MIN_READ_BYTES
