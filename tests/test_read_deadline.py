"""The engine connection's read deadline, on a clock the test moves."""

from __future__ import annotations

from sidecar.edge.engine.read_deadline import ReadDeadline
from tests.fake_time import FakeTime


def _deadline(time: FakeTime, expired: list[float]) -> ReadDeadline:
    return ReadDeadline(
        1.0, lambda: expired.append(time.now), clock=time.clock, call_later=time.call_later
    )


def test_silence_past_the_timeout_expires_it() -> None:
    """Nothing since the reader started waiting: expired once, at the timeout."""
    time, expired = FakeTime(), list[float]()
    deadline = _deadline(time, expired)
    deadline.watch()
    time.advance(0.99)
    assert expired == []
    time.advance(0.01)
    assert expired == [1.0]
    assert time.armed == 0


def test_bytes_push_it_back_with_one_timer() -> None:
    """A byte at 0.6 s moves the expiry to 1.6 s; bytes add no timer, the one timer re-arms."""
    time, expired = FakeTime(), list[float]()
    deadline = _deadline(time, expired)
    deadline.watch()
    time.advance(0.6)
    deadline.touch()
    deadline.touch()
    assert time.armed == 1
    time.advance(0.4)  # the timer fires at 1.0 s, early: re-armed for the rest
    assert (expired, time.armed) == ([], 1)
    time.advance(0.6)
    assert expired == [1.6]


def test_a_running_timer_keeps_the_last_touch() -> None:
    """A second wait while the timer runs does not restart it: the deadline is the last byte's."""
    time, expired = FakeTime(), list[float]()
    deadline = _deadline(time, expired)
    deadline.watch()
    time.advance(0.5)
    deadline.watch()
    time.advance(0.5)
    assert expired == [1.0]


def test_stop_cancels_it() -> None:
    time, expired = FakeTime(), list[float]()
    deadline = _deadline(time, expired)
    deadline.watch()
    deadline.stop()
    time.advance(5.0)
    assert (expired, time.armed) == ([], 0)


def test_resume_counts_the_silence_from_when_the_engine_was_last_heard() -> None:
    """Expired at 1.0 s, but the engine answered elsewhere 0.3 s before: it expires again at
    1.7 s, one timeout after that sign of life, unless another comes."""
    time, expired = FakeTime(), list[float]()
    deadline = _deadline(time, expired)
    deadline.watch()
    time.advance(1.0)
    assert expired == [1.0]
    deadline.resume(0.3)
    assert time.armed == 1
    time.advance(0.69)
    assert expired == [1.0]
    time.advance(0.01)
    assert expired == [1.0, 1.7]
