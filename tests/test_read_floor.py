"""The read floor: which reads of a request make its connection rest (no sockets)."""

from __future__ import annotations

import pytest

from sidecar.edge.http.read_floor import FREE_READS, MIN_READ_BYTES, ReadFloor


def rests(sizes: list[int]) -> int:
    """How many of a request's reads, of ``sizes`` bytes, are followed by a rest."""
    floor = ReadFloor()
    return sum(floor.short(size) for size in sizes)


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        pytest.param([300, 4 * 1024 * 1024], 0, id="head-then-body"),
        pytest.param([1] * FREE_READS, 0, id="free-reads-of-a-byte"),
        pytest.param([1] * (FREE_READS + 10), 10, id="a-byte-a-read-past-the-free-ones"),
        pytest.param([1448] * 3000, 0, id="an-mss-a-read"),
        pytest.param([40] * 12 + [30_000] + [1] * 100, 0, id="a-large-read-pays-for-small-ones"),
        pytest.param([MIN_READ_BYTES - 1] * (FREE_READS + 1), 1, id="just-under-the-floor"),
    ],
)
def test_reads_under_the_floor_rest_the_connection(sizes: list[int], expected: int) -> None:
    """Past FREE_READS reads, each read while the average is under MIN_READ_BYTES rests."""
    assert rests(sizes) == expected


def test_a_new_request_counts_from_none() -> None:
    """The reads of one request do not count against the next on the same connection."""
    floor = ReadFloor()
    for _ in range(FREE_READS):
        floor.short(1)
    floor.begin()
    assert not any(floor.short(1) for _ in range(FREE_READS))
