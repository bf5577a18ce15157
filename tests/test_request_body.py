"""A request body as it is buffered: what it holds is what the port's budget counts."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable
from typing import cast

import pytest
from multidict import CIMultiDict

from sidecar.edge.http.limits import BodyBudget
from sidecar.edge.http.request import Request, Wire
from sidecar.edge.proxy.intake import BodyLimits, BodyPace
from tests.fake_time import FakeTime

MIB = 1024 * 1024


def _request(budget: BodyBudget, client: str = "10.0.0.1") -> Request:
    return Request(
        "POST",
        "/v1/completions",
        (1, 1),
        CIMultiDict(),
        transport=cast(asyncio.Transport, None),
        wire=cast(Wire, None),
        client_max_size=4 * MIB,
        keep_alive=True,
        body_exists=True,
        budget=budget,
        client=client,
    )


async def test_a_body_in_two_byte_pieces_holds_about_what_it_counts() -> None:
    """256 KiB fed 2 bytes at a time, a new object each (as llhttp hands over a body sent in
    2-byte writes), holds under 1.5x its bytes, not the 20x and more of one object per piece;
    and reads back whole."""
    size = MIB // 4
    body = bytes(range(256)) * (size // 256)
    budget = BodyBudget(8 * MIB)
    request = _request(budget)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for at in range(0, size, 2):
            request.feed(body[at : at + 2])
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert budget.held == size
    assert held < 1.5 * size
    request.end_of_body()
    assert await request.read() == body


@pytest.mark.parametrize(
    ("first", "second", "fault"),
    [
        pytest.param("10.0.0.1", "10.0.0.1", "client_body_budget_full", id="same-address"),
        pytest.param("10.0.0.1", "10.0.0.2", None, id="another-address"),
    ],
)
def test_an_address_is_held_to_its_share(first: str, second: str, fault: str | None) -> None:
    """An address past its share is refused; another address still has the rest."""
    budget = BodyBudget(1000, per_client=600)
    one, two = _request(budget, first), _request(budget, second)
    one.feed(b"x" * 500)
    two.feed(b"x" * 200)
    assert two.fault == fault
    one.release()
    two.release()
    assert budget.held == 0


@pytest.mark.parametrize(
    ("silent_s", "fault_of_new", "fault_of_old"),
    [
        pytest.param(2.0, None, "stalled", id="silent-past-grace-gives-way"),
        pytest.param(0.5, "body_budget_full", None, id="within-grace-keeps-its-room"),
    ],
)
def test_a_silent_body_gives_its_room_to_an_arriving_one(
    silent_s: float, fault_of_new: str | None, fault_of_old: str | None
) -> None:
    """With the budget full, a body silent for over the grace is ended (as too slow) so that
    the next body's bytes fit; one that sent bytes lately keeps its room."""
    time = FakeTime()
    budget = BodyBudget(1000, grace_s=1.0, clock=time.clock)
    old, new = _request(budget, "10.0.0.1"), _request(budget, "10.0.0.2")
    old.feed(b"x" * 900)
    time.advance(silent_s)
    new.feed(b"x" * 300)
    assert (new.fault, old.fault) == (fault_of_new, fault_of_old)
    assert budget.held == (300 if fault_of_new is None else 900)


def _cut_at(
    limits: BodyLimits,
    received_by: Callable[[float], int],
    rested_by: Callable[[float], float] = lambda t: 0.0,
) -> float | None:
    """When a body whose bytes arrive as ``received_by(t)``, on a connection that has rested
    ``rested_by(t)``, is cut off (None: never, by 60 s)."""
    pace: BodyPace | None = limits.first_check(0.0)
    while pace is not None and pace.check_at < 60:
        now = pace.check_at
        pace = limits.check(pace, 0.0, now, received_by(now), rested_s=rested_by(now))
        if pace is None:
            return now
    return None


@pytest.mark.parametrize(
    ("received_by", "cut_at"),
    [
        pytest.param(lambda t: 4 * MIB, 10.0, id="4MiB-at-once-then-nothing"),
        pytest.param(lambda t: int(600 * t), 30.0, id="steady-above-the-floor"),
        pytest.param(lambda t: int(400 * t), 5.0, id="steady-below-the-floor"),
        # 1,000 B/s, then nothing from 8 s: the window slides every 2.5 s, so 12.5, not 15.
        pytest.param(lambda t: int(1000 * min(t, 8.0)), 12.5, id="stall-after-8s"),
    ],
)
def test_the_pace_floor_is_the_recent_pace(
    received_by: Callable[[float], int], cut_at: float | None
) -> None:
    """500 B/s over a sliding 5 s window, timeout 30 s: a fast start buys one window, not the
    timeout; a steady body above the floor runs to the timeout; one below it is cut at once."""
    limits = BodyLimits(timeout_s=30.0, min_rate=500, grace_s=5.0)
    assert _cut_at(limits, received_by) == cut_at


def _rests(t: float) -> float:
    """A connection read only when a 0.5 s rest ends: how long the rest under way has lasted."""
    return t % 0.5


@pytest.mark.parametrize(
    ("bytes_per_s", "rested_by", "cut_at"),
    [
        pytest.param(1000, _rests, 30.0, id="over-the-floor-resting"),
        # Without the rest's start, a window inside a rest sees nothing arrive: cut at once.
        pytest.param(1000, lambda t: 0.0, 0.3, id="over-the-floor-rest-unseen"),
        # Its first read, at 0.5 s, shows 25 bytes: under 100 B/s since it began.
        pytest.param(50, _rests, 0.6, id="under-the-floor-resting"),
    ],
)
def test_the_pace_window_ends_where_a_rest_began(
    bytes_per_s: int, rested_by: Callable[[float], float], cut_at: float
) -> None:
    """A client sending steadily on a connection the read floor rests for 0.5 s at a time, read
    only as each rest ends, against 100 B/s over a 0.3 s window (shorter than a rest): over the
    floor it runs to the timeout, under it it is cut at the first check after a read shows it."""
    limits = BodyLimits(timeout_s=30.0, min_rate=100, grace_s=0.3)
    received_by = lambda t: int(bytes_per_s * (t - t % 0.5))  # noqa: E731
    assert _cut_at(limits, received_by, rested_by) == pytest.approx(cut_at)
