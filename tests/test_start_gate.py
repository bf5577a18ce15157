"""slo admission's start gate, through the asyncio bulkhead: a stream holds one permit of the
limit on starts until its first token, then only its place under the cap on requests in flight;
a request that does not stream holds only that place. Every permit still comes back once."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.core.admission.modes import SloMode
from sidecar.core.admission.retry_hint import ReleaseRate
from sidecar.core.errors import AdmissionRejectedError
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import Budget, Plan, Source, Term, engine_cost, make_plan
from sidecar.limiter.bulkhead import Bulkhead
from sidecar.limiter.permit import Permit
from tests.fake_time import FakeTime
from tests.quiet_law import QuietLaw

PLAN = make_plan(
    engine_cost(1, None),
    Term(name="kv", bytes=100_000, source=Source.ENGINE),
    Budget(2_000, 8_000),
    1.0,
)


class Steered(QuietLaw):
    """The SLO law's output, fixed: ``in_flight`` requests, ``starts`` of them starting."""

    def __init__(self, in_flight: int, starts: int) -> None:
        self.in_flight, self.starts = in_flight, starts

    def step(self, plan: Plan) -> Limits:
        return Limits(limit=min(self.in_flight, self.starts), in_flight=self.in_flight)

    def hold_limit(self) -> int | None:
        return self.starts


def gate(fake: FakeTime, in_flight: int, starts: int, max_queue: int = 4) -> Bulkhead:
    """A bulkhead under slo with the law's two limits applied, as the control loop does."""
    mode = SloMode(Steered(in_flight, starts))
    bulkhead = Bulkhead(
        limit=0,
        max_queue=max_queue,
        max_wait_s=3.0,
        mode=mode,
        clock=fake.clock,
        call_later=fake.call_later,
        hint=ReleaseRate(draw=lambda: 0.0),
    )
    bulkhead.resize(mode.step(PLAN))
    return bulkhead


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def run(bulkhead: Bulkhead, cost: int, done: asyncio.Event, held: list[Permit]) -> None:
    async with bulkhead.admit(cost) as permit:
        held.append(permit)
        await done.wait()


async def test_a_first_token_lets_the_next_stream_start() -> None:
    """One stream may start at a time, three run: the second waits until the first one's first
    token, not until it ends."""
    fake, done, held = FakeTime(), asyncio.Event(), list[Permit]()
    bulkhead = gate(fake, in_flight=3, starts=1)
    tasks = [asyncio.create_task(run(bulkhead, 1, done, held)) for _ in range(2)]
    await settle()
    assert (len(held), bulkhead.snapshot().queued) == (1, 1)
    held[0].first_token()
    await settle()
    snap = bulkhead.snapshot()
    assert (len(held), snap.queued, snap.in_use, snap.in_use_cost) == (2, 0, 2, 1)
    done.set()
    await asyncio.gather(*tasks)


async def test_the_cap_in_flight_holds_after_first_tokens() -> None:
    """Two in flight, both started: a third waits for one of them to end, though nothing is
    starting."""
    fake, done, held = FakeTime(), asyncio.Event(), list[Permit]()
    bulkhead = gate(fake, in_flight=2, starts=2)
    first = [asyncio.create_task(run(bulkhead, 1, done, held)) for _ in range(2)]
    await settle()
    for permit in held:
        permit.first_token()
    other = asyncio.Event()
    third = asyncio.create_task(run(bulkhead, 1, other, held))
    await settle()
    assert (len(held), bulkhead.snapshot().queued) == (2, 1)
    done.set()
    await asyncio.gather(*first)
    await settle()
    assert len(held) == 3
    other.set()
    await third


async def test_a_request_that_does_not_stream_holds_only_a_place_in_flight() -> None:
    """The starts are full; a request priced 0 (it does not stream) still runs, within the cap
    in flight."""
    fake, done, held = FakeTime(), asyncio.Event(), list[Permit]()
    bulkhead = gate(fake, in_flight=2, starts=1)
    tasks = [
        asyncio.create_task(run(bulkhead, 1, done, held)),
        asyncio.create_task(run(bulkhead, 0, done, held)),
    ]
    await settle()
    assert (len(held), bulkhead.snapshot().in_use_cost) == (2, 1)
    with pytest.raises(AdmissionRejectedError):
        async with bulkhead.admit(0, may_wait=False):
            pass  # the cap in flight is full
    done.set()
    await asyncio.gather(*tasks)


async def test_every_permit_comes_back_once_whenever_its_first_token_came() -> None:
    """A first token twice, after the end, or never: nothing leaks, nothing is given twice."""
    fake, done, held = FakeTime(), asyncio.Event(), list[Permit]()
    bulkhead = gate(fake, in_flight=4, starts=2)
    tasks = [asyncio.create_task(run(bulkhead, 1, done, held)) for _ in range(3)]
    await settle()
    held[0].first_token()
    held[0].first_token()
    assert bulkhead.snapshot().in_use_cost == 2  # the third took the first one's start
    done.set()
    await asyncio.gather(*tasks)
    held[1].first_token()  # after its end: nothing
    snap = bulkhead.snapshot()
    assert (snap.in_use, snap.in_use_cost, snap.granted_total) == (0, 0, 3)
    assert sum(snap.released.values()) == 3


async def test_a_start_is_a_release_to_the_retry_hint() -> None:
    """Streams start twice a second, each with the next one waiting, and run on: with 2 queued
    ahead a refused caller is told about (2 + 1) / 2 = 1.5 s, the rate of starts, not of ends
    (none ended)."""
    fake, done, held = FakeTime(), asyncio.Event(), list[Permit]()
    bulkhead = gate(fake, in_flight=20, starts=1, max_queue=2)
    tasks = [asyncio.create_task(run(bulkhead, 1, done, held))]
    await settle()
    for _ in range(5):
        tasks.append(asyncio.create_task(run(bulkhead, 1, done, held)))  # waits for the start
        await settle()
        fake.advance(0.5)
        held[-1].first_token()  # lets the waiter in
        await settle()
    tasks += [asyncio.create_task(run(bulkhead, 1, done, held)) for _ in range(2)]
    await settle()
    assert bulkhead.snapshot().queued == 2
    with pytest.raises(AdmissionRejectedError) as caught:
        async with bulkhead.admit(1):
            pass
    assert caught.value.reason == "queue_full"
    assert caught.value.retry_after_s == pytest.approx(1.5)
    done.set()
    await asyncio.gather(*tasks)
