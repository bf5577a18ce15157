"""The default admission's law (sidecar.core.laws.slo_law) on its own: a Tick in, a Step out, one
behaviour a test, as Netflix's concurrency-limits tests its limits; no clock, no samples
gathered."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.core.laws.slo_law import SloLaw, Tick, start_limit
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import Budget, Source, Term, engine_cost, make_plan

# 100,000 one-byte tokens; a request of the budget holds 10,000 of them at worst: 10 permits.
PLAN = make_plan(
    engine_cost(1, None),
    Term(name="kv", bytes=100_000, source=Source.ENGINE),
    Budget(2_000, 8_000),
    1.0,
)
FAST = (0.1, 0.1, 0.1)  # three samples at a tenth of their target
LATE = (2.0, 2.0, 2.0)  # three at twice it
QUIET = Tick(
    now=0.0,
    ttft=(),
    tpot=(),
    pressed=False,
    demand=0,
    starting=0,
    waiting=None,
    kv_usage=None,
    running=None,
    ends_per_s=0.0,
    start=10,
)
# The limit bound, 20 asking, two waiting at an engine that reports its KV use (too low to tell).
BUSY = replace(QUIET, pressed=True, demand=20, starting=20, waiting=2.0, kv_usage=0.01, running=1.0)


def started(limit: int = 10) -> SloLaw:
    law = SloLaw()
    law.start(limit, blind=False)
    return law


def test_no_step_before_the_first_plan_starts_the_law() -> None:
    """Samples before any plan decide nothing: there is no limit to step."""
    assert SloLaw().step(replace(BUSY, ttft=FAST)) is None


def test_a_start_sets_both_limits() -> None:
    """Both limits start where the engine can run; the bulkhead's limit is the starts."""
    assert started(10).limits(permits=10, worst_case_only=False) == Limits(limit=10, in_flight=10)


def test_the_start_is_the_pool_over_the_typical_request_floored_at_the_worst_case() -> None:
    """400-token requests: 100,000 / 400 = 250; 40,000-token ones: the 10 worst-case permits."""
    assert start_limit(PLAN, 400, worst_case_only=False) == 250
    assert start_limit(PLAN, 40_000, worst_case_only=False) == 10
    assert start_limit(PLAN, None, worst_case_only=False) == 10


def test_an_engine_that_cannot_preempt_starts_at_its_worst_case() -> None:
    """Whatever its typical request, an engine that fails on overflow starts at the permits."""
    assert start_limit(PLAN, 400, worst_case_only=True) == 10


def test_a_blind_start_is_redone_at_the_engines_first_plan() -> None:
    """Started before the engine was seen, the law starts again once it is, until it stepped."""
    law = SloLaw()
    law.start(64, blind=True)
    assert not law.needs_start(engine_seen=False)
    assert law.needs_start(engine_seen=True)


def test_a_blind_start_that_stepped_stands() -> None:
    """Once the streams stepped it, the blind start is the law's own and is not redone."""
    law = SloLaw()
    law.start(10, blind=True)
    law.step(replace(BUSY, ttft=FAST))
    assert not law.needs_start(engine_seen=True)


def test_fast_first_tokens_on_a_pressed_limit_grow_both() -> None:
    """First tokens at a tenth of their target, the limit bound, 20 asking: both double."""
    step = started(10).step(replace(BUSY, ttft=FAST))
    assert step is not None
    assert (step.in_flight, step.starting, step.cut) == (20, 20, False)
    assert step.reason.startswith("grew")


def test_late_first_tokens_while_the_engine_queues_cut_the_starts_and_say_so() -> None:
    """First tokens at twice their target while requests wait at the engine: the starts halve;
    the requests in flight, whose pace nothing judges, still grow. The step says it cut."""
    step = started(10).step(replace(BUSY, ttft=LATE))
    assert step is not None
    assert (step.starting, step.in_flight, step.cut) == (5, 20, True)
    assert step.reason.startswith("cut")


def test_late_first_tokens_judge_in_flight_where_kv_use_is_unreported() -> None:
    """The in-flight limit holds while the engine queues and no first token came, where the
    engine does not say its KV use; where it does, the drain ceiling answers instead."""
    law = started(10)
    step = law.step(replace(BUSY, tpot=FAST, kv_usage=None))  # no first token, KV unknown
    assert step is not None
    assert step.in_flight == 10
    reported = started(10).step(replace(BUSY, tpot=FAST))
    assert reported is not None
    assert reported.in_flight > 10


def test_nothing_waiting_at_the_engine_leaves_slow_first_tokens_unjudged() -> None:
    """Without a queue at the engine, late first tokens are its compute: no cut."""
    step = started(10).step(replace(BUSY, ttft=LATE, waiting=0.0))
    assert step is not None
    assert (step.cut, step.starting) == (False, 20)


def test_the_drain_ceiling_caps_in_flight_but_never_cuts_the_law() -> None:
    """Twenty run in 95 % of the cache: it holds 21; nothing ends, so the cap in flight is 21
    while the law's own limit stays at 40."""
    law = started(40)
    step = law.step(replace(BUSY, kv_usage=0.95, running=20.0))
    assert step is not None
    assert (step.drain, step.in_flight) == (21, 40)
    assert law.limits(permits=10, worst_case_only=False).in_flight == 21


def test_where_the_drain_ceiling_binds_the_law_does_not_grow() -> None:
    """Fast streams, but the cache holds fewer than the law allows: the law holds."""
    law = started(40)
    step = law.step(replace(BUSY, tpot=FAST, demand=60, kv_usage=0.95, running=20.0))
    assert step is not None
    assert step.in_flight == 40
    assert step.reason.startswith("held: the engine's KV cache")


def test_where_the_drain_ceiling_binds_nothing_grows_fast() -> None:
    """Still in slow start, but the cache holds 21 of the law's 40 and the 21 run: no step
    would let more in, so the bulkhead hears that only a stream ending makes room."""
    law = started(40)
    assert law.grows_fast(40)
    law.step(replace(BUSY, kv_usage=0.95, running=20.0))
    assert law.in_flight is not None
    assert law.in_flight.slow_start
    assert not law.grows_fast(21)


def test_an_engine_that_cannot_preempt_is_held_to_its_worst_case_permits() -> None:
    """However far the law grew, the cap in flight is the plan's worst-case permits."""
    law = started(10)
    law.step(replace(BUSY, ttft=FAST))
    assert law.limits(permits=10, worst_case_only=True) == Limits(limit=10, in_flight=10)
    assert law.limits(permits=10, worst_case_only=False) == Limits(limit=20, in_flight=20)


def test_the_starts_are_held_within_the_requests_in_flight() -> None:
    """Slow tokens cut the requests in flight; the starts, which fast first tokens would have
    doubled, are held within them."""
    slow_tokens = (2.0, 2.0, 2.0)
    step = started(10).step(replace(BUSY, ttft=FAST, tpot=slow_tokens, waiting=0.0))
    assert step is not None
    assert (step.in_flight, step.starting) == (5, 5)


def test_a_quiet_spell_restarts_slow_start_and_says_so() -> None:
    """Cut once, then nobody presses for five seconds: the step says the limit restarted."""
    law = started(10)
    law.step(replace(BUSY, ttft=LATE))  # the cut ends slow start
    law.step(replace(QUIET, now=1.0))
    step = law.step(replace(QUIET, now=6.0))
    assert step is not None
    assert step.restarted
    assert step.reason.startswith("nobody pressed")


def test_a_limit_nobody_presses_against_holds_and_says_why() -> None:
    """Fast streams, nobody waiting: nothing grows, and the reason says it does not bind."""
    step = started(10).step(replace(QUIET, ttft=FAST, demand=10))
    assert step is not None
    assert (step.in_flight, step.starting, step.cut) == (10, 10, False)
    assert step.reason.startswith("held")


@pytest.mark.parametrize(
    ("ttft", "in_force", "fast"),
    [
        pytest.param((), 10, True, id="in-slow-start-at-its-limit"),
        pytest.param((), 8, False, id="another-cap-holds-it-lower"),
        pytest.param(LATE, 5, False, id="after-its-first-cut"),
    ],
)
def test_a_step_at_once_is_wanted_only_in_slow_start_at_the_limit(
    ttft: tuple[float, ...], in_force: int, fast: bool
) -> None:
    """A hurried tick is worth it while the binding limit may still double and is reached."""
    law = started(10)
    if ttft:
        law.step(replace(BUSY, ttft=ttft))
    assert law.grows_fast(in_force) is fast


def test_the_held_limit_is_the_starts_and_none_before_a_start() -> None:
    """What stands when the plan goes stale: the starts within the requests in flight."""
    assert SloLaw().held() is None
    law = started(10)
    law.step(replace(BUSY, ttft=LATE))
    assert law.held() == 5
