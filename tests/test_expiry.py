"""Waiters' deadlines: each expires at its deadline and not before, in deadline order, never once
discarded, under a clock that may lag the loop's timers; the entries kept stay bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.limiter.expiry import Expiry
from tests.fake_time import FakeTime


def make(fake: FakeTime, expired: list[int]) -> Expiry:
    return Expiry(now=lambda: fake.now, call_later=fake.call_later, expire=expired.append)


def test_a_ticket_expires_at_its_deadline_and_not_before() -> None:
    """Added with 3 s to wait: nothing at 2.9 s, expired at 3 s, exactly once."""
    fake, expired = FakeTime(), list[int]()
    expiry = make(fake, expired)
    expiry.add(1, 3.0)
    fake.advance(2.9)
    assert expired == []
    fake.advance(0.1)
    fake.advance(10.0)
    assert (expired, len(expiry)) == ([1], 0)


def test_a_discarded_ticket_never_expires_and_later_ones_still_do() -> None:
    """A granted waiter (discarded) is skipped; the one behind it expires on time."""
    fake, expired = FakeTime(), list[int]()
    expiry = make(fake, expired)
    expiry.add(1, 3.0)
    fake.advance(1.0)
    expiry.add(2, 3.0)
    expiry.discard(1)
    fake.advance(2.0)
    assert expired == []
    fake.advance(1.0)
    assert expired == [2]


def test_many_waiters_with_one_wait_expire_together_in_arrival_order() -> None:
    """A thousand waiters queued a millisecond apart: none at 2.999 s after the first, then each
    at its own deadline, oldest first, and none twice."""
    fake, expired = FakeTime(), list[int]()
    expiry = make(fake, expired)
    for ticket in range(1000):
        expiry.add(ticket, 3.0)
        fake.advance(0.001)
    fake.advance(1.999)
    assert expired == []
    fake.advance(0.5)
    assert expired == list(range(500))
    fake.advance(10.0)
    assert (expired, len(expiry)) == (list(range(1000)), 0)


def test_deadlines_out_of_arrival_order_expire_in_deadline_order() -> None:
    """A later, shorter wait expires first, and the earlier, longer one still on time."""
    fake, expired = FakeTime(), list[int]()
    expiry = make(fake, expired)
    expiry.add(1, 5.0)
    expiry.add(2, 1.0)
    fake.advance(1.0)
    assert expired == [2]
    fake.advance(4.0)
    assert expired == [2, 1]


def test_an_expiry_that_discards_another_due_ticket_wins_over_it() -> None:
    """Expiring one waiter may grant another due at the same moment: that one is not expired."""
    fake, expired = FakeTime(), list[int]()

    def expire(ticket: int) -> None:
        expired.append(ticket)
        expiry.discard(ticket + 1)

    expiry = Expiry(now=lambda: fake.now, call_later=fake.call_later, expire=expire)
    expiry.add(1, 3.0)
    expiry.add(2, 3.0)
    expiry.add(3, 3.0)
    fake.advance(3.0)
    assert expired == [1, 3]


def test_a_timer_fired_early_rearms_for_the_deadline() -> None:
    """A timer that fires before the clock reaches the deadline expires nothing and re-arms."""
    fake, expired = FakeTime(), list[int]()
    clock = [0.0]
    expiry = Expiry(now=lambda: clock[0], call_later=fake.call_later, expire=expired.append)
    expiry.add(1, 3.0)
    fake.advance(3.0)  # the loop's time says due; the clock read on firing lags behind
    assert (expired, len(expiry)) == ([], 1)
    clock[0] = 3.0
    fake.advance(3.0)  # only a timer armed again can fire now
    assert (expired, len(expiry)) == ([1], 0)


def test_tickets_leaving_out_of_order_keep_the_heap_bounded() -> None:
    """Waiters that leave from the middle (other compartments, cancels) do not pile up."""
    fake, expired = FakeTime(), list[int]()
    expiry = make(fake, expired)
    expiry.add(0, 60.0)  # the oldest stays queued, so nobody else leaves from the top
    for ticket in range(1, 10_000):
        expiry.add(ticket, 60.0)
        expiry.discard(ticket)
    assert expiry.held <= 2 * len(expiry) + 64
    fake.advance(60.0)
    assert expired == [0]


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 5)),
        st.tuples(st.just("discard"), st.integers(0, 30)),
        st.tuples(st.just("advance"), st.integers(0, 4)),
    ),
    max_size=60,
)


@given(_OPS)
def test_expires_exactly_the_live_tickets_past_their_deadline(ops: list[tuple[str, int]]) -> None:
    """Against a plain dict of deadlines: the same tickets expire, in deadline order."""
    fake, expired = FakeTime(), list[int]()
    expiry = make(fake, expired)
    model: dict[int, float] = {}
    expected: list[int] = []
    for ticket, (op, value) in enumerate(ops):
        if op == "add":
            expiry.add(ticket, float(value))
            model[ticket] = fake.now + value
        elif op == "discard":
            expiry.discard(value)
            model.pop(value, None)
        else:
            fake.advance(float(value))
            due = sorted((d, t) for t, d in model.items() if d <= fake.now)
            expected += [t for _, t in due]
            for _, t in due:
                del model[t]
        assert (expired, len(expiry)) == (expected, len(model))
