"""The SLO control between ticks: streams sampled as their first token comes (or as they run
late), the two limits (streams starting, steered by TTFT; requests in flight, by TPOT and the KV
cache) from what the engine can run, and the worst-case cap without preemption."""

from __future__ import annotations

from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from sidecar.core.laws.slo_limit import LimitEvidence, prompts_fit
from sidecar.core.plan.capacity import Budget, Source, Term, engine_cost, make_plan
from sidecar.core.request.claims import NO_CLAIMS, Claims
from sidecar.core.request.objectives import Objectives
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.live.probes import EngineReading
from sidecar.live.slo import MAX_SAMPLES, SloControl
from sidecar.live.sources import Readings
from tests.declared import NOTHING_DECLARED


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


DECLARED = NOTHING_DECLARED
# A pool of 100,000 one-byte tokens; a request of the budget holds 10,000 of them at worst.
PLAN = make_plan(
    engine_cost(1, None),
    Term(name="kv", bytes=100_000, source=Source.ENGINE),
    Budget(2_000, 8_000),
    1.0,
)


def reading(
    preemptions: float | None = 0.0,
    typical: tuple[float, float] | None = None,
    waiting: float = 2,
    running: float = 1,
    kv: float = 0.01,
    *,
    inference_s: float | None = None,
) -> Readings:
    """One tick of the engine's metrics; by default one request runs in a cache too empty to
    tell how many fit, and two wait; ``inference_s``: how long its requests ran (not said)."""
    prompt, generation = typical if typical is not None else (None, None)
    engine = EngineReading(
        cache=None,
        kv_usage_ratio=kv,
        requests_running=running,
        requests_waiting=waiting,
        preemptions_total=preemptions,
        observed_at=0.0,
        typical_prompt_tokens=prompt,
        typical_generation_tokens=generation,
        typical_inference_s=inference_s,
    )
    return Readings(declared=DECLARED, engine=engine)


def fast_starts(slo: SloControl, clock: FakeClock, count: int = 3) -> None:
    """``count`` streams tracked now whose first token comes 0.1 s after sending: a tenth of the
    engine's 1 s TTFT target."""
    for _ in range(count):
        timing = StreamTiming(sent=clock())
        slo.track(timing, NO_CLAIMS)
        timing.saw(1, clock() + 0.1)


def control(clock: FakeClock, pressed: bool = True, demand: int = 20) -> SloControl:
    """Objectives of 2 s and 100 ms; ``demand`` requests in flight and waiting, all of them
    starting or waiting to."""
    return SloControl(
        objectives=Objectives(2.0, 0.1),
        binding=lambda: pressed,
        demand=lambda: demand,
        starting=lambda: demand,
        clock=clock,
    )


def test_a_cold_engine_starts_at_its_worst_case_permits() -> None:
    """No history at the engine: pool / worst case = 10 requests to start."""
    slo = control(FakeClock())
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10


def test_a_warm_engine_primes_the_start_from_its_histograms() -> None:
    """The engine served requests of 40 + 360 tokens on average: 100,000 / 400 = 250 to start."""
    slo = control(FakeClock())
    slo.observe(reading(typical=(40.0, 360.0)))
    assert slo.step(PLAN).in_flight == 250


def test_a_cold_start_is_lifted_once_a_request_says_what_it_holds() -> None:
    """Started at the worst case (10) before any request came; the first asks for 400 tokens at
    its worst: the next plan lifts both limits to 100,000 / 400 = 250, once; a later, larger
    request lowers nothing."""
    slo = control(FakeClock())
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10
    slo.asked(400)
    assert (slo.step(PLAN).in_flight, slo.step(PLAN).limit) == (250, 250)
    slo.asked(10_000)
    assert slo.step(PLAN).in_flight == 250


def test_a_cut_limit_is_not_lifted_by_what_a_request_asks() -> None:
    """Cut below its start before any request said its size (slow start over): the lift is for
    a start made blind, not for a limit the streams cut."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10
    assert slo.law is not None
    slo.law.update(LimitEvidence(ttft=(), tpot=(2.0,) * 3, pressed=True))  # past it: cut
    assert slo.law.limit == 5
    slo.asked(400)
    assert slo.step(PLAN).in_flight == 5


def test_fast_first_tokens_grow_the_limit_while_streams_still_run() -> None:
    """Three streams whose first token came at a tenth of the engine's TTFT target are
    sampled on the next tick, long before they end: both limits double (to the 20 asking)."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading())
    assert (slo.step(PLAN).in_flight, slo.step(PLAN).limit) == (10, 10)
    fast_starts(slo, clock)  # target: 2 s x 0.5 = 1 s; 0.1 / 1 = 0.1 of it
    clock.advance(1.0)
    slo.observe(reading())
    assert (slo.step(PLAN).in_flight, slo.step(PLAN).limit) == (20, 20)


def test_a_burst_on_a_fresh_pod_is_let_in_on_the_first_healthy_tick() -> None:
    """Ten streams in flight, 25 more waiting for a permit: their fast first tokens take the
    limit to the 35 asking at once (within 4x), not to 20 while the rest time out."""
    clock = FakeClock()
    slo = SloControl(
        objectives=Objectives(2.0, 0.1), binding=lambda: True, demand=lambda: 35, clock=clock
    )
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10
    fast_starts(slo, clock)
    clock.advance(1.0)
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 35


def test_streams_still_waiting_past_their_target_shrink_it() -> None:
    """Three streams with no first token 2 s after they went out (twice the target): the starts
    limit is cut, by half at most, without waiting for them to start. First tokens do not judge
    the requests in flight: nothing says the pace of tokens is bad, so that limit still grows."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading())
    assert slo.step(PLAN).limit == 10
    for _ in range(3):
        slo.track(StreamTiming(sent=clock()), NO_CLAIMS)
    clock.advance(2.0)
    slo.observe(reading())
    assert (slo.step(PLAN).limit, slo.step(PLAN).in_flight) == (5, 20)


def test_a_request_objective_in_its_headers_is_the_one_it_is_held_to() -> None:
    """A stream claiming 200 ms to first token, served in 0.3 s: three times its engine target
    (half the objective), a miss; the queue wait it may have is 0.8 x its objective less
    the expected TTFT, and no more than a TTL it claims."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10
    claims = Claims(ttft_slo_ms=200)
    for _ in range(3):
        timing = StreamTiming(sent=clock())
        slo.track(timing, claims)
        timing.saw(1, clock() + 0.3)
        slo.ended(timing, completed=False)
    slo.observe(reading())
    assert slo.step(PLAN).limit == 5
    assert slo.expected_ttft_s == pytest.approx(0.15)
    assert slo.max_wait_s(claims) == pytest.approx(0.01)
    assert slo.max_wait_s(NO_CLAIMS) == pytest.approx(1.45)
    assert slo.max_wait_s(Claims(ttl_s=0.5)) == pytest.approx(0.5)


def test_slow_tokens_after_a_fast_start_shrink_it() -> None:
    """Streams that start at once but then take 0.2 s a token (twice the TPOT objective)."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10
    for _ in range(3):
        timing = StreamTiming(sent=clock())
        slo.track(timing, NO_CLAIMS)
        for i in range(5):
            timing.saw(1, clock() + 0.01 + 0.2 * i)
        slo.ended(timing, completed=True)
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 5


def test_an_engine_that_cannot_preempt_keeps_the_worst_case_permits() -> None:
    """No preemption counter: however fast the streams, never past pool / worst case."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading(preemptions=None))
    assert slo.step(PLAN).in_flight == 10
    for _ in range(3):
        timing = StreamTiming(sent=clock())
        slo.track(timing, NO_CLAIMS)
        timing.saw(1, clock() + 0.01)
    slo.observe(reading(preemptions=None))
    assert slo.law is not None
    assert slo.law.limit == 20  # the law moved ...
    assert slo.step(PLAN).in_flight == 10  # ... the limit did not
    assert slo.pricing == "worst-case"


def test_streams_sent_before_a_cut_do_not_cut_again() -> None:
    """A cut answers the streams that caused it: while they still wait, they cut no further;
    streams sent after it are what the next step hears."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10
    for _ in range(3):
        slo.track(StreamTiming(sent=clock()), NO_CLAIMS)
    clock.advance(2.0)
    slo.observe(reading())
    assert slo.step(PLAN).limit == 5
    clock.advance(1.0)
    slo.observe(reading())
    assert slo.step(PLAN).limit == 5  # the same late streams, no second cut
    fast_starts(slo, clock)
    clock.advance(1.0)
    slo.observe(reading())
    assert slo.step(PLAN).limit == 6  # new streams, fast: growth (gentle, after the cut)


def test_slow_first_tokens_with_nothing_waiting_at_the_engine_do_not_cut() -> None:
    """First tokens at twice their target while nothing waits at the engine: that is the
    engine's compute, not a queue fewer requests would shorten; requests wait at the sidecar,
    the streams' TPOT is fine, so both limits grow (the engine must be fed)."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading(waiting=0))
    assert slo.step(PLAN).in_flight == 10
    for _ in range(3):
        timing = StreamTiming(sent=clock())
        slo.track(timing, NO_CLAIMS)
        for i in range(3):
            timing.saw(1, clock() + 2.0 + 0.01 * i)
        slo.ended(timing, completed=True)
    slo.observe(reading(waiting=0))
    assert (slo.step(PLAN).in_flight, slo.step(PLAN).limit) == (20, 20)


def test_ended_streams_are_forgotten() -> None:
    """Every tracked stream is dropped when it ends, sampled or not."""
    clock = FakeClock()
    slo = control(clock)
    timings = [StreamTiming(sent=0.0) for _ in range(4)]
    for timing in timings:
        slo.track(timing, NO_CLAIMS)
    timings[0].saw(1, 0.1)
    slo.observe(reading())
    for timing in timings:
        slo.ended(timing, completed=False)
    assert slo.tracked == 0


def test_the_law_holds_its_limit_only_for_an_engine_that_preempts() -> None:
    """The limit the controller keeps when the plan goes stale: the law's for an engine seen to
    preempt; none before the first plan, nor for one that fails on overflow."""
    slo = control(FakeClock())
    assert slo.hold_limit() is None  # no plan yet
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10
    assert slo.hold_limit() == 10
    slo.observe(reading(preemptions=None))
    assert slo.hold_limit() is None


@pytest.mark.parametrize(
    ("preemptions", "slow_first_tokens", "in_force", "fast"),
    [
        pytest.param(0.0, False, 10, True, id="fresh-pod-in-slow-start"),
        pytest.param(0.0, True, 5, False, id="after-its-first-cut"),
        pytest.param(None, False, 10, False, id="engine-cannot-preempt"),
        pytest.param(0.0, False, 8, False, id="another-cap-holds-it-lower"),
    ],
)
def test_a_step_now_can_grow_the_limit_only_in_slow_start_and_uncapped(
    preemptions: float | None, slow_first_tokens: bool, in_force: int, fast: bool
) -> None:
    """A step at once is worth it while slow start may double the limit in force; not after
    its first cut, where the engine cannot preempt, or where another cap holds the limit."""
    clock = FakeClock()
    slo = control(clock)
    assert not slo.grows_fast(10)  # no plan yet: no law to step
    slo.observe(reading(preemptions=preemptions))
    slo.step(PLAN)
    if slow_first_tokens:
        for _ in range(3):
            slo.track(StreamTiming(sent=clock()), NO_CLAIMS)
        clock.advance(2.0)
        slo.observe(reading())
    assert slo.grows_fast(in_force) is fast


def test_slow_start_stops_where_the_cache_is_full() -> None:
    """Ten run in 40 % of the KV cache, 80 more ask: fast first tokens would reach for 40 (4x),
    but 10 / 0.4 = 25 is what fits; past that, the streams decide at 1.25x a tick."""
    clock = FakeClock()
    slo = SloControl(
        objectives=Objectives(2.0, 0.1), binding=lambda: True, demand=lambda: 90, clock=clock
    )
    slo.observe(reading(running=10, kv=0.4))
    assert slo.step(PLAN).in_flight == 10
    fast_starts(slo, clock)
    clock.advance(1.0)
    slo.observe(reading(running=10, kv=0.4))
    assert slo.step(PLAN).in_flight == 25


def test_late_first_tokens_cut_the_starts_and_the_pace_of_tokens_steers_in_flight() -> None:
    """Six first tokens missing at twice their target: the starts limit is halved, and holds
    while requests wait at the engine and no first token says how long; those streams then
    complete at a quarter of the TPOT objective, and the limit in flight grows on that pace."""
    clock, demand = FakeClock(), [12]
    slo = SloControl(
        objectives=Objectives(2.0, 0.1),
        binding=lambda: True,
        demand=lambda: demand[0],
        starting=lambda: demand[0],
        clock=clock,
    )
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10
    running = [StreamTiming(sent=clock()) for _ in range(6)]
    for timing in running:
        slo.track(timing, NO_CLAIMS)
    clock.advance(2.0)
    slo.observe(reading())
    assert (slo.step(PLAN).limit, slo.step(PLAN).in_flight) == (
        5,
        12,
    )  # in flight: up to the demand
    for timing in running:
        timing.saw(1, clock())
        timing.saw(40, clock() + 1.0)  # 40 tokens in a second: 25 ms a token, a quarter of 0.1 s
        slo.ended(timing, completed=True)
    clock.advance(1.0)
    demand[0] = 30
    slo.observe(reading())
    # Sent before the cut: their first tokens do not judge the starts again; the queue at the
    # engine holds it. Their pace is heard in flight: in slow start, it reaches for the 30.
    assert slo.step(PLAN).limit == 5
    assert slo.step(PLAN).in_flight == 30


def test_a_plan_from_declared_figures_does_not_outlive_the_engines_first() -> None:
    """The floor's plan from declared figures comes before the engine is seen; the engine's
    first plan, its histograms saying 400 tokens a request, starts the law again at 250."""
    slo = control(FakeClock())
    declared = make_plan(
        engine_cost(1, None),
        Term(name="kv", bytes=640_000, source=Source.DECLARED),
        Budget(2_000, 8_000),
        1.0,
    )
    assert slo.step(declared).in_flight == 64  # blind: the declared pool over the worst case
    slo.observe(reading(typical=(40.0, 360.0)))
    assert slo.step(PLAN).in_flight == 250
    assert slo.step(PLAN).in_flight == 250  # started once


def test_the_starts_never_pass_the_requests_in_flight() -> None:
    """First tokens come fast while nothing waits at the engine, but the streams run at twice
    the TPOT objective: the limit in flight is cut to 5, and the starts, which would have
    doubled, are held within it."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading(waiting=0))
    assert slo.step(PLAN).in_flight == 10
    for _ in range(3):
        timing = StreamTiming(sent=clock())
        slo.track(timing, NO_CLAIMS)
        for i in range(5):
            timing.saw(1, clock() + 0.01 + 0.2 * i)
        slo.ended(timing, completed=True)
    slo.observe(reading(waiting=0))
    assert slo.starts is not None
    assert (slo.step(PLAN).in_flight, slo.starts.limit) == (5, 5)


@pytest.mark.parametrize(
    ("kv", "in_flight"),
    [
        pytest.param(0.3, 20, id="waiting-for-compute-cuts-the-starts-only"),
        pytest.param(0.95, 6, id="waiting-for-memory-holds-in-flight-to-what-the-cache-holds"),
    ],
)
def test_why_requests_wait_at_the_engine_says_which_limit_answers_late_first_tokens(
    kv: float, in_flight: int
) -> None:
    """Three first tokens missing at twice their target while requests wait at the engine. At
    30 % KV use they wait for compute or its sequence cap: fewer starting is the answer, and
    the requests in flight, their pace unjudged, still grow. With the cache full they wait for
    memory: the requests in flight are held to the six it holds (nothing ended to make room),
    and the law itself is not cut, so that it stands again once the cache has room."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading(running=6, kv=kv))
    assert slo.step(PLAN).in_flight == 10
    for _ in range(3):
        slo.track(StreamTiming(sent=clock()), NO_CLAIMS)
    clock.advance(2.0)
    slo.observe(reading(running=6, kv=kv))
    assert (slo.step(PLAN).limit, slo.step(PLAN).in_flight) == (5, in_flight)
    assert slo.law is not None
    assert slo.law.limit >= 10


def test_in_flight_is_held_to_what_the_cache_holds_and_what_ends_free_in_time() -> None:
    """20 run in 95 % of the cache: it holds 21 at this mix. Twenty streams ended in the last
    5 s (4 a second) free room for one more within the 0.25 s a request may wait at the engine:
    22. The law's limit, which the ceiling binds, does not grow meanwhile. Once the ends fall out
    of the window, 21; at 50 % use the cache holds 40, and the law's limit stands again."""
    clock = FakeClock()
    slo = control(clock, demand=60)
    slo.observe(reading(running=5, kv=0.1))
    assert slo.step(PLAN).in_flight == 10  # the worst case: 100,000 / 10,000
    assert slo.law is not None
    for _ in range(20):
        timing = StreamTiming(sent=clock())
        slo.track(timing, NO_CLAIMS)
        timing.saw(1, clock() + 0.1)
        timing.saw(20, clock() + 1.0)
        slo.ended(timing, completed=True)
    clock.advance(1.0)
    slo.observe(reading(running=5, kv=0.1))
    assert slo.drain_limit == 51  # 5 in a tenth of the cache: 50, and 4 ends a second x 0.25 s
    grown = slo.law.limit
    assert grown > 10  # fast and paced within objective: slow start reaches for the demand
    clock.advance(1.0)
    slo.observe(reading(running=20, kv=0.95))
    assert (slo.drain_limit, slo.ends_per_s) == (22, 4.0)
    assert slo.step(PLAN).in_flight == 22 < grown
    fast_starts(slo, clock)
    clock.advance(0.5)
    slo.observe(reading(running=20, kv=0.95))
    assert slo.law.limit == grown  # bound by the ceiling, not by itself: no growth
    clock.advance(5.0)  # the ends fall out of the window: the cache holds what it holds
    slo.observe(reading(running=20, kv=0.95))
    assert (slo.drain_limit, slo.step(PLAN).in_flight) == (21, 21)
    slo.observe(reading(running=20, kv=0.5))
    assert slo.drain_limit == 40
    assert slo.step(PLAN).in_flight == min(slo.law.limit, 40) >= min(grown, 40)


def test_no_hurried_steps_once_the_limit_in_flight_was_cut() -> None:
    """Streams run at twice the TPOT objective: the limit in flight is cut to 5 and binds (the
    starts, held within it, never were cut); a step at once would only step it again."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading(waiting=0))
    slo.step(PLAN)
    assert slo.grows_fast(10)
    for _ in range(3):
        timing = StreamTiming(sent=clock())
        slo.track(timing, NO_CLAIMS)
        for i in range(5):
            timing.saw(1, clock() + 0.01 + 0.2 * i)
        slo.ended(timing, completed=True)
    slo.observe(reading(waiting=0))
    assert slo.starts is not None
    assert slo.starts.slow_start
    assert not slo.grows_fast(5)


def slow_tokens(slo: SloControl, clock: FakeClock, sent: float, count: int = 3) -> None:
    """``count`` streams sent at ``sent`` that end now after 5 tokens 0.2 s apart: twice the
    TPOT objective."""
    for _ in range(count):
        timing = StreamTiming(sent=sent)
        slo.track(timing, NO_CLAIMS)
        for i in range(5):
            timing.saw(1, sent + 0.01 + 0.2 * i)
        slo.ended(timing, completed=True)


def test_slow_tokens_of_streams_sent_before_a_cut_do_not_cut_again() -> None:
    """A burst's prefills stall every decode: the streams that ran through it end with slow
    tokens after the cut they caused, and cut no further; slow tokens from streams sent since
    the cut do."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 10
    before = clock()
    clock.advance(1.0)
    slow_tokens(slo, clock, before)
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 5  # the cut: 10 x 1 / 2
    clock.advance(1.0)
    slow_tokens(slo, clock, before)
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 5  # the same burst's victims: no second cut
    slow_tokens(slo, clock, clock())
    slo.observe(reading())
    assert slo.step(PLAN).in_flight == 2  # sent after the cut, and still slow: 5 x 1 / 2


def test_a_quiet_spell_after_a_cut_logs_one_restart() -> None:
    """A cut, then five seconds with nobody pressing: slo_restart once, not on the cut itself."""
    clock = FakeClock()
    pressed = [True]
    slo = SloControl(
        objectives=Objectives(2.0, 0.1),
        binding=lambda: pressed[0],
        demand=lambda: 0,
        starting=lambda: 0,
        clock=clock,
    )
    slo.observe(reading())
    slo.step(PLAN)
    with capture_logs() as logs:
        clock.advance(1.0)
        slow_tokens(slo, clock, clock() - 1.0)
        slo.observe(reading())
        slo.step(PLAN)
        pressed[0] = False
        for _ in range(7):
            clock.advance(1.0)
            slo.observe(reading())
            slo.step(PLAN)
    events = [entry["event"] for entry in logs]
    assert events.count("slo_backoff") == 1
    assert events.count("slo_restart") == 1
    assert slo.step(PLAN).in_flight == 10  # back at the start: pool / worst case


def test_samples_waiting_for_a_first_plan_are_bounded() -> None:
    """No plan ever starts the law (a source that never answers): the samples of streams that
    keep ending wait for it, the newest MAX_SAMPLES of each kind, not every one."""
    clock = FakeClock()
    slo = control(clock)
    for _ in range(MAX_SAMPLES + 100):
        timing = StreamTiming(sent=clock())
        slo.track(timing, NO_CLAIMS)
        timing.saw(1, clock() + 0.1)
        timing.saw(5, clock() + 0.5)
        slo.ended(timing, completed=True)
        slo.observe(reading())
    assert [len(kind) for kind in slo._samples] == [MAX_SAMPLES, MAX_SAMPLES]
    assert len(slo._ttfts) == MAX_SAMPLES


def test_a_cold_cache_is_reached_by_what_the_pool_holds_of_the_typical_prompt() -> None:
    """A burst lands on an idle engine whose prompts average 1,000 tokens: before the engine
    has started any (its cache says nothing under 5 % use) the reach is what the pool of
    100,000 holds of such prompts, 100; once the cache says, the drain ceiling is the reach;
    an engine that never said what a prompt holds gives no reach while its cache is cold."""
    clock = FakeClock()
    slo = control(clock)
    slo.observe(reading(typical=(1_000.0, 200.0), running=0, kv=0.0))
    assert slo.in_flight_reach() is None  # no plan yet: no pool to divide
    slo.step(PLAN)
    assert slo.drain_limit is None
    assert slo.in_flight_reach() == 100
    slo.observe(reading(typical=(1_000.0, 200.0), running=30, kv=0.6))
    assert slo.in_flight_reach() == slo.drain_limit == 50
    blind = control(clock)
    blind.observe(reading(running=0, kv=0.0))
    blind.step(PLAN)
    assert blind.in_flight_reach() is None


@pytest.mark.parametrize(
    ("pool", "prompt", "block", "fit"),
    [
        pytest.param(57_664, 2_000.0, 16, 28, id="whole-blocks"),  # 2,000 -> 2,000 (125 blocks)
        pytest.param(57_664, 2_001.0, 16, 28, id="a-part-block-is-a-block"),  # 2,016 a prompt
        pytest.param(1_000, 5_000.0, None, 1, id="never-below-one"),
        pytest.param(1_000, None, 16, None, id="no-typical-prompt"),
        pytest.param(1_000, 0.0, 16, None, id="no-tokens-no-say"),
    ],
)
def test_what_the_pool_holds_of_a_prompt(
    pool: int, prompt: float | None, block: int | None, fit: int | None
) -> None:
    assert prompts_fit(pool, prompt, block) == fit


def test_the_cache_as_it_fills_is_told_from_the_engines_figures() -> None:
    """30 % of a 100,000-token pool used; the engine's requests average 1,000 prompt tokens and
    200 generated over 5 s: each adds 40 tokens a second. Nothing before the first plan (no
    pool), nor where the engine does not say how long its requests run."""
    clock = FakeClock()
    slo = control(clock)
    readings = reading(typical=(1_000.0, 200.0), running=30, kv=0.3, inference_s=5.0)
    engine = readings.engine
    assert engine is not None
    slo.observe(readings)
    assert slo.cache_growth(engine) is None
    slo.step(PLAN)
    growth = slo.cache_growth(engine)
    assert growth is not None
    assert (growth.pool_tokens, growth.prompt_tokens, growth.tokens_per_s) == (100_000, 1_000, 40)
    assert growth.used_tokens == pytest.approx(30_000)
    assert slo.cache_growth(replace(engine, typical_inference_s=None)) is None
    assert slo.cache_growth(None) is None
