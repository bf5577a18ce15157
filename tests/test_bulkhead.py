"""The asyncio bulkhead: releases, timeouts, cancel races, resize, drain, shadow (fake time)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from structlog.testing import capture_logs

from sidecar.core.admission.compartments import parse_compartments
from sidecar.core.admission.frees_forecast import CacheGrowth
from sidecar.core.admission.modes import CountMode, TokenMode
from sidecar.core.admission.retry_hint import ReleaseRate
from sidecar.core.errors import AdmissionRejectedError
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import engine_cost
from sidecar.limiter.bulkhead import Bulkhead
from sidecar.limiter.events import AdmissionEvent
from sidecar.limiter.permit import Permit
from tests.fake_time import FakeTime


def new_log() -> list[str]:
    return []


def new_events() -> list[AdmissionEvent]:
    return []


async def settle() -> None:
    """Let every ready task run (no real time passes)."""
    for _ in range(10):
        await asyncio.sleep(0)


def make(fake: FakeTime, events: list[AdmissionEvent] | None = None, **kwargs: object) -> Bulkhead:
    options: dict[str, object] = {"limit": 1, "max_queue": 4, "max_wait_s": 3.0}
    options["hint"] = ReleaseRate(draw=lambda: 0.0)  # no jitter: each quote at its place's start
    options.update(kwargs)
    return Bulkhead(
        clock=fake.clock,
        call_later=fake.call_later,
        on_event=events.append if events is not None else None,
        **options,  # type: ignore[arg-type]
    )


async def release_twice_a_second(bulkhead: Bulkhead, fake: FakeTime) -> None:
    """Six permits of limit 1 held half a second each, the next one waiting behind each: waiters
    get in twice a second, the rate the retry hint sees (it counts releases that let a waiter
    in, and time while one waits)."""
    gates = [asyncio.Event() for _ in range(6)]

    async def one(gate: asyncio.Event) -> None:
        async with bulkhead.admit():
            await gate.wait()

    tasks = [asyncio.create_task(one(gates[0]))]
    await settle()
    for index, gate in enumerate(gates):
        if index + 1 < len(gates):
            tasks.append(asyncio.create_task(one(gates[index + 1])))
            await settle()
        fake.advance(0.5)
        gate.set()
        await settle()
    await asyncio.gather(*tasks)


async def test_a_refused_caller_is_told_how_long_a_place_is_held_not_how_often_one_came() -> None:
    """Light use (a stream of two seconds every half minute, nobody waiting) says how long a
    place is held, not how fast places free when the pod is full: with the one place held, a
    refused caller is told the two seconds it frees in (Little's law), not the half minute
    between the streams."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake, max_queue=0)
    for _ in range(5):
        async with bulkhead.admit():
            fake.advance(2.0)
        fake.advance(30.0)
    holder = asyncio.create_task(hold(bulkhead, gate, log, "holder"))
    await settle()
    with pytest.raises(AdmissionRejectedError) as caught:
        await hold(bulkhead, gate, log, "late")
    assert caught.value.retry_after_s == pytest.approx(2.0)
    gate.set()
    await holder


async def test_before_anything_was_served_a_refused_caller_is_told_the_unknown_hint() -> None:
    """Nothing served and no grant to a waiter measured: the unknown-rate hint."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake, max_queue=0)
    holder = asyncio.create_task(hold(bulkhead, gate, log, "holder"))
    await settle()
    with pytest.raises(AdmissionRejectedError) as caught:
        await hold(bulkhead, gate, log, "late")
    assert caught.value.retry_after_s == 1.0  # HintBounds.unknown_s: nothing measured
    gate.set()
    await holder


async def test_a_queue_after_light_use_is_not_refused_as_hopeless() -> None:
    """Light use long before a burst (a stream of 0.2 s every ten seconds, nobody waiting) does
    not make the burst's waiters look hopeless: a place frees every 0.2 s, not every 10 s, so
    they queue and get in."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake, max_queue=4, max_wait_s=1.5)
    for _ in range(3):
        async with bulkhead.admit():
            fake.advance(0.2)
        fake.advance(10.0)
    tasks = [asyncio.create_task(hold(bulkhead, gate, log, f"u{i}")) for i in range(4)]
    await settle()
    assert bulkhead.snapshot().queued == 3
    gate.set()
    await asyncio.gather(*tasks)
    assert log == ["u0", "u1", "u2", "u3"]


async def hold(
    bulkhead: Bulkhead,
    gate: asyncio.Event,
    log: list[str],
    name: str,
    *,
    source: str | None = None,
) -> Permit:
    async with bulkhead.admit(source=source) as permit:
        log.append(name)
        await gate.wait()
    return permit


async def holder_and_waiter(
    bulkhead: Bulkhead,
    gate: asyncio.Event,
    log: list[str],
    waiter_gate: asyncio.Event | None = None,
) -> tuple[asyncio.Task[Permit], asyncio.Task[Permit]]:
    """One task holding the only permit until ``gate``, and one queued behind it."""
    holder = asyncio.create_task(hold(bulkhead, gate, log, "holder"))
    await settle()
    waiter = asyncio.create_task(hold(bulkhead, waiter_gate or gate, log, "waiter"))
    await settle()
    return holder, waiter


async def test_a_permit_not_yet_granted_or_refused_releases_nothing() -> None:
    """admit() returns the permit before deciding it: releasing it then, or after a refusal, or
    twice after its grant, gives back nothing, and shutdown still waits for the one held."""
    bulkhead = make(FakeTime(), max_queue=0)
    early = bulkhead.admit()
    async with bulkhead.admit() as held:
        early.release()
        refused = bulkhead.admit()
        with pytest.raises(AdmissionRejectedError):
            await refused.__aenter__()
        refused.release()
        idle = asyncio.create_task(bulkhead.idle())
        await settle()
        assert not idle.done()
        assert (bulkhead.snapshot().in_use, bulkhead.snapshot().released) == (1, {})
    await settle()
    assert idle.done()
    held.release("failed")  # a second release: ignored, the first said completed
    async with early:
        assert bulkhead.snapshot().in_use == 1
    assert bulkhead.snapshot().released == {"completed": 2}


async def test_uncontended_admit_releases_completed_on_exit() -> None:
    """A free permit is granted without waiting and released as completed."""
    bulkhead = make(FakeTime())
    async with bulkhead.admit() as permit:
        assert permit.wait_s == 0.0
        assert bulkhead.snapshot().in_use == 1
    snap = bulkhead.snapshot()
    assert (snap.in_use, snap.released) == (0, {"completed": 1})


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        pytest.param(RuntimeError("boom"), "failed", id="exception-is-failed"),
        pytest.param(asyncio.CancelledError(), "cancelled", id="cancel-is-cancelled"),
    ],
)
async def test_exit_by_exception_reports_outcome_and_reraises(
    error: BaseException, outcome: str
) -> None:
    """Errors leave the block unchanged and the release says how the work ended."""
    bulkhead = make(FakeTime())
    with pytest.raises(type(error)):
        async with bulkhead.admit():
            raise error
    assert bulkhead.snapshot().released == {outcome: 1}


async def test_handler_can_mark_client_gone() -> None:
    """A handler that saw the client go away marks the permit; the release counts it cancelled."""
    bulkhead = make(FakeTime())
    async with bulkhead.admit() as permit:
        permit.outcome = "cancelled"
    assert bulkhead.snapshot().released == {"cancelled": 1}


async def refused_after(
    fake: FakeTime, waiter: asyncio.Task[Any], seconds: float
) -> AdmissionRejectedError:
    """The refusal ``waiter`` gets exactly ``seconds`` from now: still waiting 10 ms before."""
    fake.advance(seconds - 0.01)
    await settle()
    assert not waiter.done()
    fake.advance(0.01)
    with pytest.raises(AdmissionRejectedError) as caught:
        await waiter
    return caught.value


async def test_waiter_times_out_at_max_wait() -> None:
    """With the permit held, a waiter is refused with 'timeout' after exactly max_wait_s."""
    fake, gate, log, events = FakeTime(), asyncio.Event(), new_log(), new_events()
    bulkhead = make(fake, events)
    holder, waiter = await holder_and_waiter(bulkhead, gate, log)
    refusal = await refused_after(fake, waiter, 3.0)
    assert refusal.reason == "timeout"
    assert 0.5 <= refusal.retry_after_s <= 60
    gate.set()
    await holder
    snap = bulkhead.snapshot()
    assert (snap.in_use, snap.queued, snap.rejected) == (0, 0, {"timeout": 1})
    assert log == ["holder"]
    timeout = next(e for e in events if e.kind == "rejected")
    assert (timeout.reason, timeout.compartment, timeout.cost) == ("timeout", "default", 1)


@pytest.mark.parametrize(
    ("ttl_s", "waits_s"),
    [(None, 10.0), (4.0, 4.0), (1.0, 1.0)],
    ids=["the-wait-for-returns", "its-ttl-past-the-wait", "its-ttl-within-it"],
)
async def test_a_caller_back_as_told_waits_the_bulkheads_wait_for_returns(
    ttl_s: float | None, waits_s: float
) -> None:
    """The place held: a return waits 10 s (return_wait_s) where anyone else waits 3 s, its
    own TTL still bounding it."""
    fake, gate = FakeTime(), asyncio.Event()
    bulkhead = make(fake, return_wait_s=10.0)
    holder = asyncio.create_task(hold(bulkhead, gate, new_log(), "holder"))
    await settle()

    async def back() -> None:
        async with bulkhead.admit(max_wait_s=ttl_s, returning=True):
            pass

    waiter = asyncio.create_task(back())
    await settle()
    assert (await refused_after(fake, waiter, waits_s)).reason == "timeout"
    gate.set()
    await holder


async def test_waiter_is_granted_on_release_with_its_wait_time() -> None:
    """A waiter gets the permit the moment it is released and reports how long it waited."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake)
    holder, waiter = await holder_and_waiter(bulkhead, gate, log, waiter_gate=asyncio.Event())
    fake.advance(1.25)
    gate.set()
    await holder
    await settle()
    assert log == ["holder", "waiter"]
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert bulkhead.snapshot().released == {"completed": 1, "cancelled": 1}


async def test_cancel_while_queued_leaves_no_trace() -> None:
    """A queued waiter cancelled is gone: not in the queue, not counted, never granted."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake)
    holder, waiter = await holder_and_waiter(bulkhead, gate, log)
    waiter.cancel()
    await settle()
    assert bulkhead.snapshot().queued == 0
    gate.set()
    await holder
    snap = bulkhead.snapshot()
    assert (snap.in_use, snap.granted_total, snap.rejected) == (0, 1, {})
    assert waiter.cancelled()


@pytest.mark.parametrize(
    "cancel_first",
    [
        pytest.param(True, id="cancel-then-grant"),
        pytest.param(False, id="grant-then-cancel"),
    ],
)
async def test_grant_and_cancel_in_the_same_tick_leak_nothing(cancel_first: bool) -> None:
    """Whichever of grant and cancel comes first, the permit ends up free and released once."""
    fake, log = FakeTime(), new_log()
    bulkhead = make(fake)
    holding = bulkhead.admit()
    permit = await holding.__aenter__()
    waiter = asyncio.create_task(hold(bulkhead, asyncio.Event(), log, "waiter"))
    third = asyncio.create_task(hold(bulkhead, asyncio.Event(), log, "third"))
    await settle()
    # Both happen before the waiter's task runs again: the race a real loop can produce.
    if cancel_first:
        waiter.cancel()
        permit.release()
    else:
        permit.release()
        waiter.cancel()
    await settle()
    assert waiter.cancelled()
    assert log == ["third"], "the cancelled waiter's grant went on to the next one"
    third.cancel()
    await settle()
    await holding.__aexit__(None, None, None)
    snap = bulkhead.snapshot()
    assert (snap.in_use, snap.queued) == (0, 0)
    assert snap.released == {"completed": 1, "cancelled": 2}


async def test_timeout_after_grant_loses_the_race() -> None:
    """A timer that fires after the grant (already dispatched) does not undo it."""
    fake, gate, log = FakeTime(honour_cancel=False), asyncio.Event(), new_log()
    events = new_events()
    bulkhead = make(fake, events)
    release_waiter = asyncio.Event()
    holder, waiter = await holder_and_waiter(bulkhead, gate, log, waiter_gate=release_waiter)
    gate.set()
    await holder
    fake.advance(3.0)  # the waiter's timer fires now, after its grant
    await settle()
    assert log == ["holder", "waiter"]
    release_waiter.set()
    await waiter
    snap = bulkhead.snapshot()
    assert (snap.in_use, snap.rejected, snap.released) == (0, {}, {"completed": 2})
    assert [e.kind for e in events if e.kind == "rejected"] == []


async def test_growing_wakes_waiters_in_fifo_order() -> None:
    """Resize 1 -> 3 admits the two oldest waiters at once, in arrival order."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake)
    tasks = [asyncio.create_task(hold(bulkhead, gate, log, f"w{i}")) for i in range(4)]
    await settle()
    assert log == ["w0"]
    bulkhead.resize(Limits(limit=3))
    await settle()
    assert log == ["w0", "w1", "w2"]
    gate.set()
    await asyncio.gather(*tasks)
    assert bulkhead.snapshot().released == {"completed": 4}


async def test_shrink_to_zero_keeps_running_work_and_admits_nobody() -> None:
    """Limit 0 while one runs: it finishes; the waiter is granted only when the limit returns."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake)
    tasks = [asyncio.create_task(hold(bulkhead, gate, log, f"w{i}")) for i in range(2)]
    await settle()
    bulkhead.resize(Limits(limit=0))
    gate.set()
    await settle()
    assert log == ["w0"]
    assert bulkhead.snapshot().queued == 1
    bulkhead.resize(Limits(limit=1))
    await asyncio.gather(*tasks)
    assert log == ["w0", "w1"]


async def test_drain_refuses_waiters_and_newcomers_and_idle_waits_for_running() -> None:
    """Drain: the waiter and a newcomer get 'draining'; idle() returns once the runner ends."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake)
    holder, waiter = await holder_and_waiter(bulkhead, gate, log)
    bulkhead.drain()
    with pytest.raises(AdmissionRejectedError, match="shutting down") as caught:
        await waiter
    assert caught.value.reason == "draining"
    with pytest.raises(AdmissionRejectedError):
        await hold(bulkhead, gate, log, "late")
    idle = asyncio.create_task(bulkhead.idle())
    await settle()
    assert not idle.done()
    gate.set()
    await holder
    await asyncio.wait_for(idle, 1)
    assert bulkhead.snapshot().rejected == {"draining": 2}


async def test_shadow_mode_counts_a_rejection_but_lets_the_request_run() -> None:
    """Shadow: the would-be queue_full is counted and shown on the permit; nobody is refused."""
    fake, events = FakeTime(), new_events()
    bulkhead = make(fake, events, max_queue=0, shadow=True)
    async with bulkhead.admit() as first, bulkhead.admit() as second:
        assert first.shadow_rejected is None
        assert second.shadow_rejected == "queue_full"
        assert bulkhead.snapshot().in_use == 1, "the shadow-rejected one holds no permit"
    snap = bulkhead.snapshot()
    assert (snap.rejected, snap.released, snap.in_use) == ({"queue_full": 1}, {"completed": 1}, 0)
    assert all(e.shadow for e in events)


async def test_shadow_mode_does_not_delay_and_records_a_would_be_timeout() -> None:
    """Shadow: a would-be waiter runs at once; after max_wait it is marked as a timeout."""
    fake = FakeTime()
    bulkhead = make(fake, shadow=True)
    async with bulkhead.admit(), bulkhead.admit() as second:
        assert second.shadow_rejected is None
        assert not bulkhead.waiting()  # it runs: no stalled stream gives its place up for it
        fake.advance(3.0)
        assert second.shadow_rejected == "timeout"
    snap = bulkhead.snapshot()
    assert (snap.rejected, snap.queued, snap.in_use) == ({"timeout": 1}, 0, 0)
    await asyncio.wait_for(bulkhead.idle(), 1)


async def test_token_mode_rejects_too_large_at_once_and_charges_bytes() -> None:
    """Token mode: 600 + 400 bytes fit in 1000; a 1001-byte request is too_large at once."""
    bulkhead = make(FakeTime(), limit=1000, mode=TokenMode(lambda: engine_cost(1, None)))
    async with bulkhead.admit(600) as big, bulkhead.admit(400) as small:
        assert (big.cost, small.cost) == (600, 400)
        assert bulkhead.snapshot().in_use_cost == 1000
        with pytest.raises(AdmissionRejectedError) as caught:
            async with bulkhead.admit(1001):
                pass
    assert caught.value.reason == "too_large"
    assert caught.value.retry_after_s == 60.0


async def test_compartments_route_unknown_tenants_to_default() -> None:
    """A tenant the spec does not name lands in 'default'; a named one in its own compartment."""
    comps = parse_compartments("gold=50%")
    bulkhead = make(FakeTime(), limit=4, compartments=comps)
    async with bulkhead.admit(compartment="gold") as gold, bulkhead.admit(compartment="x") as x:
        assert (gold.compartment, x.compartment) == ("gold", "default")
        in_use = {c.name: c.in_use for c in bulkhead.snapshot().compartments}
        assert in_use == {"gold": 1, "default": 1}


async def test_retry_hint_follows_the_release_rate_and_queue() -> None:
    """Two releases a second and 2 queued ahead: come back in about (2 + 1) / 2 = 1.5 s."""
    fake = FakeTime()
    bulkhead = make(fake, max_queue=2)
    await release_twice_a_second(bulkhead, fake)
    gate, log = asyncio.Event(), new_log()
    tasks = [asyncio.create_task(hold(bulkhead, gate, log, f"w{i}")) for i in range(3)]
    await settle()
    with pytest.raises(AdmissionRejectedError) as caught:
        await hold(bulkhead, gate, log, "late")
    assert caught.value.reason == "queue_full"
    assert caught.value.retry_after_s == pytest.approx(1.5)
    gate.set()
    await asyncio.gather(*tasks)


async def test_events_describe_every_decision() -> None:
    """The observer sees every decision (granted, queued, rejected), with the wait it took."""
    fake, events, gate, log = FakeTime(), new_events(), asyncio.Event(), new_log()
    bulkhead = make(fake, events, max_queue=1)
    holder, waiter = await holder_and_waiter(bulkhead, gate, log)
    with pytest.raises(AdmissionRejectedError):
        await hold(bulkhead, gate, log, "late")
    fake.advance(2.0)
    gate.set()
    await asyncio.gather(holder, waiter)
    kinds = [(e.kind, e.reason) for e in events]
    assert kinds == [
        ("granted", None),
        ("queued", None),
        ("rejected", "queue_full"),
        ("granted", None),
    ]
    assert events[3].wait_s == 2.0


async def test_failing_observer_is_logged_and_admission_goes_on() -> None:
    """An observer that raises is logged; the permit is still granted and released."""

    def broken(event: AdmissionEvent) -> None:
        raise ValueError("metrics broke")

    bulkhead = make(FakeTime())
    bulkhead.on_event = broken
    with capture_logs() as logs:
        async with bulkhead.admit():
            pass
    assert bulkhead.snapshot().released == {"completed": 1}
    assert logs[0]["event"] == "admission_observer_failed"


async def test_default_timer_uses_the_running_loop() -> None:
    """Without an injected timer, max_wait_s=0 times a waiter out on the loop's next turn."""
    bulkhead = Bulkhead(limit=1, max_queue=1, max_wait_s=0.0)
    async with bulkhead.admit():
        with pytest.raises(AdmissionRejectedError) as caught:
            async with bulkhead.admit():
                pass
    assert caught.value.reason == "timeout"


async def test_shrink_refuses_a_queued_request_that_can_never_fit_and_lets_the_next_run() -> None:
    """Token mode: after a shrink, a queued 800-byte head is refused too_large at once and the
    200-byte request behind it is granted as soon as it fits, not blocked behind the head."""
    bulkhead = make(FakeTime(), limit=1000, mode=TokenMode(lambda: engine_cost(1, None)))
    gate = asyncio.Event()

    async def run(cost: int) -> int:
        async with bulkhead.admit(cost) as permit:
            await gate.wait()
            return permit.cost

    holder = asyncio.create_task(run(900))
    await settle()
    big, small = asyncio.create_task(run(800)), asyncio.create_task(run(200))
    await settle()
    bulkhead.resize(Limits(limit=500))
    await settle()
    assert big.done()
    with pytest.raises(AdmissionRejectedError) as caught:
        big.result()
    assert caught.value.reason == "too_large"
    assert bulkhead.snapshot().queued == 1  # the small one waits only for the holder
    gate.set()
    assert await holder == 900
    assert await small == 200
    assert bulkhead.snapshot().in_use == 0


async def test_every_way_out_of_the_queue_forgets_the_waiters_deadline() -> None:
    """Granted, timed out, cancelled or drained: no deadline of a waiter outlives its wait, so
    a busy sidecar's timers do not grow with the requests it has served."""
    fake, log = FakeTime(), new_log()
    bulkhead = make(fake, limit=1, max_queue=100)
    gates = [asyncio.Event() for _ in range(6)]
    tasks = [asyncio.create_task(hold(bulkhead, gate, log, str(i))) for i, gate in enumerate(gates)]
    await settle()
    assert bulkhead.snapshot().queued == 5
    for i in range(3):  # three waiters granted in turn, each after the one before it ended
        gates[i].set()
        await settle()
    assert log == ["0", "1", "2", "3"]
    tasks[4].cancel()  # one cancelled while queued
    await settle()
    expiry = bulkhead._expiry  # the deadlines, kept behind one timer
    assert expiry is not None
    assert len(expiry) == 1, "only the one still queued has a deadline"
    fake.advance(3.0)  # and it times out
    await settle()
    bulkhead.drain()
    gates[3].set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[5], AdmissionRejectedError)
    assert results[5].reason == "timeout"
    assert isinstance(results[4], asyncio.CancelledError)
    assert len(expiry) == 0
    assert fake.armed == 0


async def test_a_wait_past_the_deadline_is_refused_at_once() -> None:
    """Two releases a second and a 1 s wait: the waiters 0 and 1 ahead may queue (0.5 s, 1 s),
    the one with 2 ahead (1.5 s) is refused at once, queue_full, though the queue has room."""
    fake = FakeTime()
    bulkhead = make(fake, max_queue=10, max_wait_s=1.0)
    await release_twice_a_second(bulkhead, fake)
    gate, log = asyncio.Event(), new_log()
    tasks = [asyncio.create_task(hold(bulkhead, gate, log, f"w{i}")) for i in range(3)]
    await settle()
    assert bulkhead.snapshot().queued == 2
    with pytest.raises(AdmissionRejectedError) as caught:
        await hold(bulkhead, gate, log, "hopeless")
    assert caught.value.reason == "queue_full"
    assert caught.value.waited_s == 0
    snapshot = bulkhead.snapshot()
    assert (snapshot.queued, snapshot.rejected) == (2, {"queue_full": 1})
    gate.set()
    await asyncio.gather(*tasks)
    assert bulkhead.snapshot().in_use == 0


async def test_without_a_release_rate_the_queue_bound_alone_decides() -> None:
    """Before two releases nobody can tell a wait: requests queue up to max_queue."""
    fake = FakeTime()
    bulkhead = make(fake, max_queue=3, max_wait_s=0.1)
    gate, log = asyncio.Event(), new_log()
    tasks = [asyncio.create_task(hold(bulkhead, gate, log, f"w{i}")) for i in range(4)]
    await settle()
    assert bulkhead.snapshot().queued == 3
    gate.set()
    await asyncio.gather(*tasks)


async def test_pressed_says_whether_the_limit_bound_since_last_asked() -> None:
    """Uncontended admissions do not press; a queued request does while it waits."""
    fake = FakeTime()
    bulkhead = make(fake)
    async with bulkhead.admit():
        pass
    assert not bulkhead.pressed()
    gate, log = asyncio.Event(), new_log()
    holder, waiter = await holder_and_waiter(bulkhead, gate, log)
    assert bulkhead.pressed()
    assert bulkhead.pressed()  # still waiting
    assert bulkhead.waiting()
    gate.set()
    await asyncio.gather(holder, waiter)
    assert not bulkhead.pressed()  # granted, and nobody waited since the last question
    assert not bulkhead.waiting()


async def test_turned_away_counts_the_refusals_for_room_since_last_asked() -> None:
    """Two refused for room (no queue) while one holds the only permit: 2, then 0 until more;
    a request that can never fit is not demand turned away."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake, max_queue=0)
    holder = asyncio.create_task(hold(bulkhead, gate, log, "holder"))
    await settle()
    for name in ("late", "later"):
        with pytest.raises(AdmissionRejectedError):
            await hold(bulkhead, gate, log, name)
    assert bulkhead.turned_away() == 2
    assert bulkhead.turned_away() == 0
    with pytest.raises(AdmissionRejectedError):
        async with bulkhead.admit(cost=5):  # more than the limit could ever give
            pass
    assert bulkhead.turned_away() == 0
    gate.set()
    await holder


async def test_a_request_with_a_shorter_wait_is_refused_by_its_own() -> None:
    """Two releases a second: with 1 ahead the wait is about 1 s, within the bulkhead's 3 s but
    past the 0.5 s the request asked for (an SLO header): refused at once."""
    fake = FakeTime()
    bulkhead = make(fake, max_queue=10, max_wait_s=3.0)
    await release_twice_a_second(bulkhead, fake)
    gate, log = asyncio.Event(), new_log()
    tasks = [asyncio.create_task(hold(bulkhead, gate, log, f"w{i}")) for i in range(2)]
    await settle()
    with pytest.raises(AdmissionRejectedError) as caught:
        async with bulkhead.admit(max_wait_s=0.5):
            pass
    assert caught.value.reason == "queue_full"
    gate.set()
    await asyncio.gather(*tasks)


async def test_retry_hint_after_an_idle_minute_is_the_rate_before_it() -> None:
    """Places held half a second each, then a minute with nothing held, then a burst: two
    queued ahead of the one place means back in (2 + 1) / 2 = 1.5 s (Little's law: one place
    over half a second), not the minute's quiet spread over the releases."""
    fake = FakeTime()
    bulkhead = make(fake, max_queue=2)
    await release_twice_a_second(bulkhead, fake)
    fake.advance(60.0)
    gate, log = asyncio.Event(), new_log()
    tasks = [asyncio.create_task(hold(bulkhead, gate, log, f"w{i}")) for i in range(3)]
    await settle()
    fake.advance(0.2)
    with pytest.raises(AdmissionRejectedError) as caught:
        await hold(bulkhead, gate, log, "late")
    assert caught.value.reason == "queue_full"
    assert caught.value.retry_after_s == pytest.approx(3 / 2)
    gate.set()
    await asyncio.gather(*tasks)


async def queued_behind_one(
    bulkhead: Bulkhead, gate: asyncio.Event, log: list[str], waiting: int
) -> tuple[asyncio.Task[Permit], list[asyncio.Task[Permit]]]:
    """One task holding the only place until ``gate``, and ``waiting`` queued behind it."""
    holder = asyncio.create_task(hold(bulkhead, gate, log, "holder"))
    await settle()
    waiters = [asyncio.create_task(hold(bulkhead, gate, log, f"w{i}")) for i in range(waiting)]
    await settle()
    assert bulkhead.snapshot().queued == waiting
    return holder, waiters


async def test_waiters_timing_out_together_are_told_places_one_release_apart() -> None:
    """Four waiters behind the one place (held 2 s a stream, as the engine says) time out
    together: each is told its place among the refused, 2 s apart, not the queue it leaves
    behind (which told all four 8 s, to come back together)."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    events: list[AdmissionEvent] = []
    bulkhead = make(fake, events, max_queue=4, max_wait_s=10.0)
    bulkhead.expect_hold(2.0)
    holder, waiters = await queued_behind_one(bulkhead, gate, log, 4)
    fake.advance(10.0)
    await settle()
    refused = [e.retry_after_s for e in events if e.kind == "rejected"]
    assert refused == pytest.approx([2.0, 4.0, 6.0, 8.0])
    for task in waiters:
        with pytest.raises(AdmissionRejectedError):
            await task
    gate.set()
    await holder


async def test_before_a_grant_to_a_waiter_a_burst_queues_whatever_the_pace() -> None:
    """Streams hold the one place 2 s (the engine's mean) and a request may wait 3 s: by that
    pace the third behind it waits 6 s, but no grant to a waiter was measured yet, and slow
    start may grow the limit the pace is priced at, so all three queue."""
    fake, gate, log = FakeTime(), asyncio.Event(), new_log()
    bulkhead = make(fake, max_queue=4, max_wait_s=3.0)
    bulkhead.expect_hold(2.0)
    holder, waiters = await queued_behind_one(bulkhead, gate, log, 3)
    bulkhead.resize(Limits(limit=4))  # slow start: the limit grows, the burst gets in
    await settle()
    gate.set()
    await asyncio.gather(holder, *waiters)
    assert log == ["holder", "w0", "w1", "w2"]


async def test_places_freed_while_every_place_is_held_price_the_hint() -> None:
    """Two places in flight held by streams that end a second apart, each place taken again at
    once: a refused caller is told the second a place takes to free while the pod is full (the
    slower of that and the pace of the holds served, two places over 1.75 s)."""
    fake, log = FakeTime(), new_log()
    bulkhead = make(fake, limit=8, max_queue=0)
    bulkhead.resize(Limits(limit=8, in_flight=2))
    gates = [asyncio.Event() for _ in range(6)]
    tasks = [asyncio.create_task(hold(bulkhead, gates[i], log, f"s{i}")) for i in range(2)]
    await settle()
    for index in range(2, 6):  # one ends, the next takes its place: the pod stays full
        fake.advance(1.0)
        gates[index - 2].set()
        await settle()
        tasks.append(asyncio.create_task(hold(bulkhead, gates[index], log, f"s{index}")))
        await settle()
    with pytest.raises(AdmissionRejectedError) as caught:
        await hold(bulkhead, asyncio.Event(), log, "late")
    assert caught.value.reason == "queue_full"
    assert caught.value.retry_after_s == pytest.approx(1.0)
    for gate in gates:
        gate.set()
    await asyncio.gather(*tasks)


async def full_of_holders(
    fake: FakeTime,
    gates: list[asyncio.Event],
    log: list[str],
    *,
    hold_s: float,
    places: int = 2,
    spread: tuple[float, ...] | None = None,
    max_wait_s: float = 3.0,
    mode: CountMode | None = None,
) -> tuple[Bulkhead, list[asyncio.Task[Permit]]]:
    """``places`` in flight (two), all taken at time 0 by streams the engine says run
    ``hold_s`` on average, spread as ``spread`` says (all of them ``hold_s``); a request may
    wait ``max_wait_s`` (3 s)."""
    bulkhead = make(fake, limit=8, max_queue=4, max_wait_s=max_wait_s, mode=mode)
    bulkhead.resize(Limits(limit=8, in_flight=places))
    bulkhead.expect_hold(hold_s, spread or (hold_s,))
    tasks = [asyncio.create_task(hold(bulkhead, gates[i], log, f"s{i}")) for i in range(places)]
    await settle()
    return bulkhead, tasks


async def test_a_full_pods_waiter_no_place_frees_for_in_time_is_refused_at_once() -> None:
    """Every place held by streams 1 s into their 20 s: no place frees within the 3 s a request
    may wait, so it is told at once, to come back when the first is forecast to end (19 s),
    instead of waiting out its 3 s to be refused."""
    fake, log = FakeTime(), new_log()
    gates = [asyncio.Event() for _ in range(2)]
    bulkhead, tasks = await full_of_holders(fake, gates, log, hold_s=20.0)
    fake.advance(1.0)
    with pytest.raises(AdmissionRejectedError) as caught:
        await hold(bulkhead, asyncio.Event(), log, "late")
    assert caught.value.reason == "queue_full"
    assert caught.value.waited_s == 0.0
    assert caught.value.retry_after_s == pytest.approx(19.0)
    for gate in gates:
        gate.set()
    await asyncio.gather(*tasks)


async def test_a_full_pods_waiter_waits_for_a_place_forecast_to_free_in_time() -> None:
    """The same streams 18 s in: the first is forecast to end within 2 s, so the request
    queues, and gets the place when it frees."""
    fake, log = FakeTime(), new_log()
    gates = [asyncio.Event() for _ in range(3)]
    bulkhead, tasks = await full_of_holders(fake, gates, log, hold_s=20.0)
    fake.advance(18.0)
    late = asyncio.create_task(hold(bulkhead, gates[2], log, "late"))
    await settle()
    assert bulkhead.snapshot().queued == 1
    fake.advance(2.0)
    gates[0].set()
    await settle()
    assert bulkhead.snapshot().queued == 0
    for gate in gates:
        gate.set()
    await asyncio.gather(late, *tasks)
    assert log[-1] == "late"


async def test_where_the_cap_fell_under_those_running_more_must_end_before_a_place_frees() -> None:
    """Two streams hold places, one due to end at 10 s and one at 20 s. At 8 s a newcomer
    would queue for the first end (2 s away, within the 3 s it may wait); with the cap in flight
    fallen to one (the cache filled), the first end frees no place, so it is refused at once."""
    for cap, queued in ((2, True), (1, False)):
        fake, log = FakeTime(), new_log()
        gates = [asyncio.Event() for _ in range(3)]
        bulkhead, tasks = await full_of_holders(fake, gates, log, hold_s=15.0)
        bulkhead.expect_hold(15.0, (10.0, 20.0))
        bulkhead.resize(Limits(limit=8, in_flight=cap))
        fake.advance(8.0)
        late = asyncio.create_task(hold(bulkhead, gates[2], log, "late"))
        await settle()
        assert (bulkhead.snapshot().queued == 1) is queued
        for gate in gates:
            gate.set()
        await asyncio.gather(*tasks, late, return_exceptions=not queued)


async def test_waiters_queued_before_the_forecast_could_tell_are_judged_when_limits_come() -> None:
    """A newcomer queues behind two streams while nothing says how long they run; the next
    limits pushed find the engine saying 20 s: its place cannot free within the 3 s it may
    wait, so it is refused then (queue_full, told when), not left to time out."""
    fake, log = FakeTime(), new_log()
    events: list[AdmissionEvent] = []
    bulkhead = make(fake, events, limit=8, max_queue=4, max_wait_s=3.0)
    bulkhead.resize(Limits(limit=8, in_flight=2))
    gates = [asyncio.Event() for _ in range(2)]
    tasks = [asyncio.create_task(hold(bulkhead, gates[i], log, f"s{i}")) for i in range(2)]
    await settle()
    late = asyncio.create_task(hold(bulkhead, asyncio.Event(), log, "late"))
    await settle()
    assert bulkhead.snapshot().queued == 1
    fake.advance(0.5)
    bulkhead.expect_hold(20.0, (20.0,))
    bulkhead.resize(Limits(limit=8, in_flight=2))
    await settle()
    with pytest.raises(AdmissionRejectedError) as caught:
        await late
    assert caught.value.reason == "queue_full"
    assert caught.value.waited_s == pytest.approx(0.5)
    assert caught.value.retry_after_s >= 19.0
    for gate in gates:
        gate.set()
    await asyncio.gather(*tasks)


class SlowStartToThree(CountMode):
    """A law in slow start whose reach (the cache's drain ceiling) is three in flight."""

    def grows_fast(self, in_force: int) -> bool:
        return True

    def in_flight_reach(self) -> int | None:
        return 3


async def test_while_slow_start_grows_the_places_only_those_past_its_reach_are_hopeless() -> None:
    """Two places held by streams 1 s into their 20 s, slow start about to grow the places to
    three: the first newcomer waits for the growth; the second is past what growth brings and
    no place frees for it within 3 s, so it is told at once."""
    fake, log = FakeTime(), new_log()
    gates = [asyncio.Event() for _ in range(3)]
    bulkhead, tasks = await full_of_holders(fake, gates, log, hold_s=20.0, mode=SlowStartToThree())
    fake.advance(1.0)
    grown = asyncio.create_task(hold(bulkhead, gates[2], log, "grown"))
    await settle()
    assert bulkhead.snapshot().queued == 1
    with pytest.raises(AdmissionRejectedError) as caught:
        await hold(bulkhead, asyncio.Event(), log, "past")
    assert caught.value.reason == "queue_full"
    assert caught.value.waited_s == 0.0
    bulkhead.resize(Limits(limit=8, in_flight=3))  # the growth comes
    await settle()
    assert log[-1] == "grown"
    for gate in gates:
        gate.set()
    await asyncio.gather(grown, *tasks)


@pytest.mark.parametrize(
    ("cache", "queued"),
    [
        pytest.param(None, True, id="an-end-lets-it-in"),
        pytest.param(
            CacheGrowth(pool_tokens=360, used_tokens=330, prompt_tokens=100, tokens_per_s=10),
            False,
            id="the-cache-grew-past-one-more",
        ),
    ],
)
async def test_a_waiters_place_frees_where_the_cache_takes_one_more(
    cache: CacheGrowth | None, queued: bool
) -> None:
    """Three places held for 1 s by streams of 10 or 30 s (one ends in 9 s, two in 29 s); a
    newcomer may wait 10 s. Counted by the ends, the first frees its place in time. But the
    three 100-token prompts grow 10 tokens a second in a pool of 360: at 9 s the two left hold
    400, and the cache takes nobody until the others end at 29 s, so it is told at once."""
    fake, log = FakeTime(), new_log()
    gates = [asyncio.Event() for _ in range(4)]
    bulkhead, tasks = await full_of_holders(
        fake, gates, log, hold_s=20.0, places=3, spread=(10.0, 30.0), max_wait_s=10.0
    )
    bulkhead.expect_cache(cache)
    fake.advance(1.0)
    late = asyncio.create_task(hold(bulkhead, gates[3], log, "late"))
    await settle()
    assert (bulkhead.snapshot().queued == 1) is queued
    if not queued:
        with pytest.raises(AdmissionRejectedError) as caught:
            await late
        assert caught.value.reason == "queue_full"
        assert caught.value.retry_after_s >= 28.0
    for gate in gates:
        gate.set()
    await asyncio.gather(*tasks, late, return_exceptions=True)


# --- the grant order by source ------------------------------------------------------------------


async def test_a_source_holding_nothing_is_not_hopeless_behind_another_sources_queue() -> None:
    """Two places let a waiter in about four times a second and a request may wait 1 s: one
    source holds both places and has four waiters queued, and its fifth is refused as hopeless
    (1.25 s). A request from another source has nobody ahead of it: it queues, and takes the
    next place that frees."""
    fake = FakeTime()
    bulkhead = make(fake, max_queue=10, max_wait_s=1.0)
    await release_twice_a_second(bulkhead, fake)
    bulkhead.resize(Limits(limit=2))
    first, rest, log = asyncio.Event(), asyncio.Event(), new_log()
    tasks = [asyncio.create_task(hold(bulkhead, first, log, "h0", source="heavy"))]
    for index in range(1, 6):
        tasks.append(asyncio.create_task(hold(bulkhead, rest, log, f"h{index}", source="heavy")))
    await settle()
    async with asyncio.timeout(1):
        with pytest.raises(AdmissionRejectedError) as caught:
            await hold(bulkhead, rest, log, "h6", source="heavy")
    assert caught.value.reason == "queue_full"
    tasks.append(asyncio.create_task(hold(bulkhead, rest, log, "light", source="light")))
    await settle()
    assert bulkhead.snapshot().queued == 5
    first.set()
    await settle()
    assert log == ["h0", "h1", "light"]
    rest.set()
    await asyncio.gather(*tasks)
    assert log == ["h0", "h1", "light", "h2", "h3", "h4", "h5"]


async def test_waiters_are_judged_in_the_order_they_are_to_be_let_in() -> None:
    """Both places held by one source; its waiter queued before the light source's while
    nothing said how long streams run. The engine then says one place frees in 2 s and the
    other in 19.5 s, and a waiter may wait 3 s: the light waiter is next, so it waits for the
    first; the older heavy one would get only the second, so it is refused now."""
    fake, log = FakeTime(), new_log()
    bulkhead = make(fake, limit=8, max_queue=4, max_wait_s=3.0)
    bulkhead.resize(Limits(limit=8, in_flight=2))
    gates = [asyncio.Event() for _ in range(3)]
    tasks = [
        asyncio.create_task(hold(bulkhead, gates[i], log, f"s{i}", source="heavy"))
        for i in range(2)
    ]
    await settle()
    heavy = asyncio.create_task(hold(bulkhead, gates[2], log, "heavy", source="heavy"))
    light = asyncio.create_task(hold(bulkhead, gates[2], log, "light", source="light"))
    await settle()
    assert bulkhead.snapshot().queued == 2
    fake.advance(0.5)
    bulkhead.expect_hold(11.0, (2.5, 20.0))
    bulkhead.resize(Limits(limit=8, in_flight=2))
    await settle()
    with pytest.raises(AdmissionRejectedError) as caught:
        await heavy
    assert caught.value.reason == "queue_full"
    assert bulkhead.snapshot().queued == 1
    fake.advance(2.0)
    gates[0].set()
    await settle()
    assert log[-1] == "light"
    for gate in gates:
        gate.set()
    await asyncio.gather(light, *tasks)
