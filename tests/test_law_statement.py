"""docs/adaptive.md's statement of the SLO law against the code: its constants are read from the
statement's block and compared with the code's, and each behaviour it states is a test here, on
the pure law, carrying the words of the block it checks (deleting or rewording them fails too)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import TypeVar

import pytest

from sidecar.core.admission.modes import SloMode
from sidecar.core.laws import slo_law
from sidecar.core.laws.slo_law import ENGINE_QUEUE_S, SloLaw, Tick, start_limit
from sidecar.core.laws.slo_limit import (
    LimitEvidence,
    SloLimit,
    SloLimitConfig,
    drain_allowance,
    fits_in_cache,
)
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import Plan
from sidecar.core.request.claims import Claims
from sidecar.core.request.objectives import Objectives
from sidecar.live import slo as live_slo
from sidecar.live.control_loop import HURRY_GAP_S
from sidecar.live.slo import ENDS_WINDOW_S, SloControl
from tests.quiet_law import QuietLaw
from tests.test_slo_control import PLAN, FakeClock, control, reading

ADAPTIVE_MD = Path(__file__).parent.parent / "docs" / "adaptive.md"
Test = TypeVar("Test", bound=Callable[..., None])
STATED: dict[str, str] = {}  # test name -> the words of the law's block it checks


def law_lines() -> list[str]:
    """docs/adaptive.md from "Each law takes" to the table of series after the law."""
    text = ADAPTIVE_MD.read_text(encoding="utf-8")
    start = text.index("\nEach law takes")
    return text[start : text.index("\n| series |", start)].splitlines()


def law_section() -> str:
    """The law's statement and the bullets after it, whitespace folded to single spaces."""
    return " ".join(" ".join(law_lines()).split())


def law_block() -> str:
    """The indented statement under "and steps", whitespace folded to single spaces."""
    return " ".join(" ".join(line for line in law_lines() if line.startswith("    ")).split())


def states(words: str) -> Callable[[Test], Test]:
    """Marks a test as the check of ``words`` in the law's block."""

    def mark(test: Test) -> Test:
        STATED[test.__name__] = words
        return test

    return mark


def documented_constants() -> dict[str, float]:
    """The ``name = value`` pairs of the block's ``constants:`` paragraph."""
    block = law_block()
    constants = block[block.index("constants:") : block.index("p(samples)")]
    return {name: float(value) for name, value in re.findall(r"(\w+) = ([0-9.]+)", constants)}


def code_constants() -> dict[str, float]:
    """SloLimitConfig's defaults, fits_in_cache's least KV use and the live loop's constants."""
    config = SloLimitConfig()
    least = inspect.signature(fits_in_cache).parameters["least"].default
    return {
        **{f.name: float(getattr(config, f.name)) for f in fields(config)},
        "least": least,
        "ENGINE_QUEUE_S": slo_law.ENGINE_QUEUE_S,
        "ENDS_WINDOW_S": live_slo.ENDS_WINDOW_S,
        "TTFT_SMOOTHING": live_slo.TTFT_SMOOTHING,
    }


def test_the_statement_gives_every_constant_the_code_has_and_no_other() -> None:
    """Each constant of the law, with the value the statement gives it."""
    assert documented_constants() == code_constants()


def prose_figures() -> list[object]:
    """Figures the bullets after the law state in words, each beside the code's value."""
    config = SloLimitConfig()
    return [
        pytest.param(f"p{round(config.quantile * 100)} ", id="quantile"),
        pytest.param(f"Fewer than {config.min_samples} samples: no step", id="min_samples"),
        pytest.param(f"After {config.restart_after_s:g} s of that", id="restart_after_s"),
        pytest.param(f"within {ENGINE_QUEUE_S:g} s (`ENGINE_QUEUE_S`", id="engine_queue_s"),
        pytest.param(f"nothing ended in the last {ENDS_WINDOW_S:g} s", id="ends_window_s"),
        pytest.param(f"every {HURRY_GAP_S:g} s while requests still wait", id="hurry_gap_s"),
        pytest.param(f"`aim` ({config.aim:g}) x its TTFT objective", id="aim"),
    ]


@pytest.mark.parametrize("words", prose_figures())
def test_the_bullets_give_the_figures_the_code_has(words: str) -> None:
    """A figure the prose repeats (the quantile, the samples, the windows) is the code's."""
    assert words in law_section()


def healthy(n: int = 3, at: float = 0.1) -> tuple[float, ...]:
    return (at,) * n


def cut_once(law: SloLimit) -> None:
    """One step past the aim: slow start ends."""
    law.update(LimitEvidence(ttft=healthy(at=1.6), pressed=True))
    assert not law.slow_start


# --- the steps -------------------------------------------------------------------------------


@states("# a limit nobody presses against does not grow")
def test_a_limit_nobody_presses_against_does_not_grow() -> None:
    """Streams at a tenth of their targets, but no request waited: the limit stays."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=healthy(), tpot=healthy(), pressed=False)) == 10


@states(
    "no step; the samples, whether the limit was pressed and the most demand seen wait for the "
    "next tick"
)
def test_pressure_on_a_tick_too_short_of_samples_counts_at_the_next_step() -> None:
    """Two samples on a pressed tick make no step; the third, on a tick nobody pressed, steps
    with the pressure seen before it: the limit grows."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=healthy(2), pressed=True)) == 10
    assert law.update(LimitEvidence(ttft=healthy(1), pressed=False)) == 20
    assert law.update(LimitEvidence(ttft=healthy(3), pressed=False)) == 20  # spent by that step


@states("(demand below is that most)")
def test_demand_on_a_tick_too_short_of_samples_counts_at_the_next_step() -> None:
    """A fresh pod at one in flight: seven requests want to run on a tick with one sample (then
    are turned away), the step comes two ticks later with one in flight: slow start reaches for
    the eight seen (x4 at most: 4), not the one left at the step's own tick."""
    law = SloLimit(1)
    assert law.update(LimitEvidence(ttft=healthy(1), pressed=True, demand=8)) == 1
    assert law.update(LimitEvidence(ttft=healthy(1), pressed=True, demand=1)) == 1
    assert law.update(LimitEvidence(ttft=healthy(1), pressed=True, demand=1)) == 4
    assert law.update(LimitEvidence(ttft=healthy(3), pressed=True, demand=1)) == 4  # spent


@states("if gradient < 1: slow start ends # the first cut")
def test_slow_start_ends_with_the_first_cut_and_growth_is_gentler_after() -> None:
    """x2 in slow start; after a cut, the same healthy streams grow it by max_gradient."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=healthy(), pressed=True)) == 20
    cut_once(law)  # 20 x 0.5
    assert law.update(LimitEvidence(ttft=healthy(), pressed=True)) == 12  # 10 x 1.25


@pytest.mark.parametrize(
    ("p90", "grown"),
    [
        pytest.param(0.4, 20, id="half-the-aim-doubles"),
        pytest.param(0.5, 16, id="above-half-the-aim-grows-by-aim-over-p90"),
        pytest.param(0.79, 11, id="just-under-the-aim-grows-by-one-at-least"),
    ],
)
@states("TTFT gradient = aim / p(TTFT)")
def test_slow_start_doubles_only_at_or_below_half_the_aim(p90: float, grown: int) -> None:
    """Slow start's x2 is a clamp of aim / p90: it doubles only where p90 <= aim / 2."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=healthy(at=p90), pressed=True)) == grown


@states("1 otherwise # between aim and objective: hold")
def test_tpot_between_aim_and_objective_holds() -> None:
    """TPOT at 0.9 of its objective: no growth, no cut, and slow start goes on."""
    law = SloLimit(40)
    evidence = LimitEvidence(ttft=(), tpot=healthy(at=0.9), pressed=True, ttft_judges=False)
    assert law.update(evidence) == 40
    assert law.slow_start


@states("aim / p(TPOT) if p(TPOT) < aim # below the aim: grow")
def test_tpot_below_the_aim_grows() -> None:
    """After a cut, TPOT at half its objective grows the limit by the gentler top (1.25)."""
    law = SloLimit(40)
    cut_once(law)
    evidence = LimitEvidence(ttft=(), tpot=healthy(at=0.5), pressed=True, ttft_judges=False)
    assert law.update(evidence) == 25


@states("1 / p(TPOT) if p(TPOT) > 1 # past the objective: cut back to it")
def test_tpot_past_its_objective_cuts_back_to_it() -> None:
    """TPOT p90 at 1.6 x its objective: the limit x 1 / 1.6, not aim / 1.6."""
    law = SloLimit(40)
    evidence = LimitEvidence(ttft=(), tpot=healthy(at=1.6), pressed=True, ttft_judges=False)
    assert law.update(evidence) == 25


@states("gradient = clamp(min(TTFT gradient, TPOT gradient), min_gradient, top)")
def test_the_worse_of_ttft_and_tpot_decides_within_the_clamp() -> None:
    """Fast tokens do not hide slow starts, and no step cuts more than by half."""
    law = SloLimit(40)
    evidence = LimitEvidence(ttft=healthy(at=2.0), tpot=healthy(9, at=0.1), pressed=True)
    assert law.update(evidence) == 20  # aim / 2.0 = 0.4, clamped to 0.5


@states("TTFT gradient = aim / p(TTFT) if TTFT judges and there are TTFT samples, else top")
def test_late_first_tokens_do_not_cut_a_limit_they_do_not_judge() -> None:
    """TTFTs at twice their targets where TTFT does not judge (no queue at the engine, or the
    limit in flight where the engine reports its KV use): healthy TPOT decides, and it grows."""
    law = SloLimit(40)
    evidence = LimitEvidence(ttft=healthy(at=2.0), tpot=healthy(at=0.5), pressed=True)
    assert law.update(replace(evidence, ttft_judges=False)) > 40


@states("if TTFT judges and no TTFT samples: gradient = min(gradient, 1)")
def test_a_queue_at_the_engine_without_a_first_token_holds_the_limit() -> None:
    """TTFT judges (requests wait at the engine) and none came: healthy TPOT cannot grow it."""
    law = SloLimit(40)
    assert law.update(LimitEvidence(ttft=(), tpot=healthy(), pressed=True)) == 40


@states("if demand > 0: new = max(limit, min(new, demand)) # no further than the demand")
def test_slow_start_grows_no_further_than_the_demand() -> None:
    """Healthy streams would double 10, but only 13 are in flight and waiting."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=healthy(), pressed=True, demand=13)) == 13


@states("new = max(new, min(demand, slow_start_reach x limit)) # reach for the demand")
def test_slow_start_reaches_for_the_demand_within_four_times_the_limit() -> None:
    """A burst of 70 on a limit of 21 is let in at once; one of 5,000 reaches 84."""
    law = SloLimit(21)
    assert law.update(LimitEvidence(ttft=healthy(), pressed=True, demand=70)) == 70
    flood = SloLimit(21)
    assert flood.update(LimitEvidence(ttft=healthy(), pressed=True, demand=5000)) == 84


@states("if fits is known: new = max(limit, min(new, fits)) # no further than the cache holds")
def test_slow_start_grows_no_further_than_the_cache_holds() -> None:
    """The cache holds 15 at this mix: slow start stops there, and never cuts to it."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=healthy(), pressed=True, demand=80, fits=15)) == 15
    above = SloLimit(30)
    assert above.update(LimitEvidence(ttft=healthy(), pressed=True, demand=80, fits=15)) == 30


@states("a p of 0 gives top")
def test_samples_of_zero_give_the_largest_step() -> None:
    """First tokens at once: p90 of 0 is no latency at all, the gradient is top."""
    law = SloLimit(10)
    assert law.update(LimitEvidence(ttft=healthy(at=0.0), pressed=True)) == 20


@states("quiet: if not pressed and demand <= limit / 2 on every tick for restart_after_s:")
def test_a_quiet_spell_restarts_slow_start_from_at_least_the_start() -> None:
    """Cut to 10, then 5 s with nobody pressing and at most half the limit in use: slow start
    again, from the start a fresh pod would have (30)."""
    law = SloLimit(20)
    cut_once(law)
    for now in (0.0, 2.5, 4.9):
        law.update(LimitEvidence(ttft=(), pressed=False, demand=5, now=now, start=30))
        assert (law.slow_start, law.limit) == (False, 10)
    law.update(LimitEvidence(ttft=(), pressed=False, demand=5, now=5.0, start=30))
    assert (law.slow_start, law.limit) == (True, 30)


@states("on every tick for restart_after_s")
def test_one_busy_tick_starts_the_quiet_spell_over() -> None:
    """A tick with more than half the limit in use resets the spell's clock."""
    law = SloLimit(20)
    cut_once(law)
    law.update(LimitEvidence(ttft=(), pressed=False, demand=5, now=0.0, start=30))
    law.update(LimitEvidence(ttft=(), pressed=False, demand=6, now=3.0, start=30))
    law.update(LimitEvidence(ttft=(), pressed=False, demand=5, now=5.0, start=30))
    assert not law.slow_start


@states("then starts = min(starts, in flight), within [floor, ceiling]")
def test_the_starts_are_held_within_the_limit_in_flight() -> None:
    """Starts at 50 beside a limit in flight of 12: 12; never below the floor."""
    starts = SloLimit(50)
    starts.hold_within(12)
    assert starts.limit == 12
    starts.hold_within(0)
    assert starts.limit == 1


@states("limit = new, within [floor, ceiling]")
def test_the_limit_stays_within_floor_and_ceiling() -> None:
    """Cuts stop at 1, growth at 4096."""
    law = SloLimit(1)
    assert law.update(LimitEvidence(ttft=healthy(at=5.0), pressed=True)) == 1
    top = SloLimit(4000)
    assert top.update(LimitEvidence(ttft=healthy(), pressed=True, demand=9000)) == 4096


# --- around the steps ------------------------------------------------------------------------


@states("drain = max(1, floor(fits + ends/s x ENGINE_QUEUE_S))")
def test_the_drain_ceiling_is_what_the_cache_holds_and_what_ends_free_in_time() -> None:
    """20 held and 8 ends a second: 2 more within 0.25 s; nothing held, nothing ending: 1."""
    assert drain_allowance(20, 8.0, ENGINE_QUEUE_S) == 22
    assert drain_allowance(0, 0.0, ENGINE_QUEUE_S) == 1


@states("`floor(running / KV usage)`, the requests the KV cache holds at the present mix")
def test_what_the_cache_holds_is_running_over_its_use_from_least_up() -> None:
    """20 running in 95 %: 21; under 5 % the cache cannot tell."""
    assert fits_in_cache(20, 0.95) == 21
    assert fits_in_cache(1, 0.049) is None


@states("start = max(1, worst-case permits, floor(pool tokens x alpha / typical tokens))")
def test_the_start_is_the_pool_over_the_typical_request_floored_at_the_worst_case() -> None:
    """A pool of 100,000 tokens: typical requests of 400 tokens start at 250; of 40,000 (2 fit)
    at the worst-case permits, 10; with no history, those permits too."""
    assert start_for((40.0, 360.0)) == 250
    assert start_for((20_000.0, 20_000.0)) == 10
    assert start_for(None) == 10


def start_for(typical: tuple[float, float] | None) -> int:
    slo = control(FakeClock())
    slo.observe(reading(typical=typical))
    in_flight = slo.step(PLAN).in_flight
    assert in_flight is not None
    return in_flight


@states("max wait = min(max(0, aim x its TTFT objective - expected TTFT), its queue TTL,")
def test_the_max_wait_under_slo_is_the_aim_of_the_ttft_objective_less_the_expected_ttft() -> None:
    """A 2 s objective with 0.5 s of engine TTFT expected: 0.8 x 2 - 0.5 = 1.1 s; a TTL of
    0.3 s: 0.3 s; an engine slower than the aim: 0."""
    slo = SloControl(objectives=Objectives(2.0, 0.1))
    slo.expected_ttft_s = 0.5
    assert slo.max_wait_s(Claims()) == pytest.approx(1.1)
    assert slo.max_wait_s(Claims(ttl_s=0.3)) == 0.3
    slo.expected_ttft_s = 3.0
    assert slo.max_wait_s(Claims()) == 0.0


# --- the law's composition (sidecar.core.laws.slo_law), on the pure law ------------------------


def busy_tick(**changes: object) -> Tick:
    """The limit bound, 20 asking, two waiting at an engine whose KV use is too low to tell."""
    tick = Tick(
        now=0.0,
        ttft=(),
        tpot=(),
        pressed=True,
        demand=20,
        starting=20,
        waiting=2.0,
        kv_usage=0.01,
        running=1.0,
        ends_per_s=0.0,
        start=10,
    )
    return replace(tick, **changes)  # type: ignore[arg-type]


class Fixed(QuietLaw):
    """A started law as SloMode steps it: its limits for each plan, nothing heard."""

    def __init__(self, law: SloLaw, *, worst_case_only: bool = False) -> None:
        self.law, self.worst_case_only = law, worst_case_only

    def step(self, plan: Plan) -> Limits:
        return self.law.limits(permits=plan.permits, worst_case_only=self.worst_case_only)

    def hold_limit(self) -> int | None:
        return self.law.held()


def started_law(limit: int = 10) -> SloLaw:
    law = SloLaw()
    law.start(limit, blind=False)
    return law


@states("TTFT judges: starts: if engine queued; in flight: if engine queued and KV use unreported")
def test_late_first_tokens_judge_in_flight_only_where_kv_use_is_unreported() -> None:
    """Late first tokens while the engine queues cut the starts; they cut in flight too only
    where the engine does not report its KV use."""
    reported = started_law().step(busy_tick(ttft=healthy(at=2.0)))
    unreported = started_law().step(busy_tick(ttft=healthy(at=2.0), kv_usage=None, running=None))
    assert reported is not None
    assert unreported is not None
    assert (reported.starting, reported.in_flight) == (5, 20)
    assert (unreported.starting, unreported.in_flight) == (5, 5)


@states("in flight: pressed and demand >= limit and not drain < limit")
def test_in_flight_is_pressed_only_where_demand_reaches_it_and_no_drain_binds() -> None:
    """Fast streams on a bound limit: in flight grows with 15 asking for its 10, not with 9
    asking, nor where the cache holds fewer than it allows."""
    fast = healthy(at=0.1)
    grown = started_law().step(busy_tick(tpot=fast, demand=15))
    short = started_law().step(busy_tick(tpot=fast, demand=9))
    drained = started_law().step(busy_tick(tpot=fast, demand=40, kv_usage=0.9, running=4.0))
    assert grown is not None
    assert short is not None
    assert drained is not None
    assert grown.in_flight > 10
    assert short.in_flight == 10
    assert drained.in_flight == 10


@states("TPOT: in flight only (the starts hear none)")
def test_slow_tokens_cut_in_flight_and_not_the_starts() -> None:
    """Tokens at twice their objective: in flight halves; the starts hear none of them and do
    not step (no gradient of theirs), only held within the requests in flight."""
    step = started_law(20).step(busy_tick(tpot=healthy(at=2.0), waiting=0.0, demand=40))
    assert step is not None
    assert (step.gradient, step.in_flight) == (0.5, 10)
    assert (step.starts_gradient, step.starting) == (None, 10)


@states("a tick that lowers either limit is the last cut")
def test_a_tick_that_lowers_either_limit_is_a_cut() -> None:
    """Late first tokens lower the starts alone: the step is a cut; fast ones are not."""
    cut = started_law().step(busy_tick(ttft=healthy(at=2.0)))
    grown = started_law().step(busy_tick(ttft=healthy(at=0.1)))
    assert cut is not None
    assert grown is not None
    assert (cut.cut, grown.cut) == (True, False)


@states("# read each tick, never written back into the law")
def test_the_drain_ceiling_caps_the_limits_and_never_the_laws_own() -> None:
    """20 running fill 95 % of the cache: it holds 21, so 21 in flight at most, while the law
    keeps its own 40 for when the cache has room again."""
    law = started_law(40)
    law.step(busy_tick(kv_usage=0.95, running=20.0))
    assert law.limits(permits=10, worst_case_only=False) == Limits(limit=21, in_flight=21)
    assert law.in_flight is not None
    assert law.in_flight.limit == 40


@states("the worst-case permits if the engine cannot preempt)")
def test_the_cap_in_flight_is_every_cap_and_the_bulkheads_limit_the_starts_within_it() -> None:
    """The law at 40 in flight and 12 starting: the setting (30), the engine's slots (25) and,
    where it cannot preempt, the 10 worst-case permits each cap the requests in flight, and the
    bulkhead's limit is the starts within that cap."""

    def law(worst_case_only: bool) -> Fixed:
        started = started_law(40)
        assert started.starts is not None
        started.starts.hold_within(12)
        return Fixed(started, worst_case_only=worst_case_only)

    assert SloMode(law(False)).step(PLAN) == Limits(limit=12, in_flight=40)
    assert SloMode(law(False), cap=30).step(PLAN, slots=25) == Limits(limit=12, in_flight=25)
    assert SloMode(law(True), cap=30).step(PLAN, slots=25) == Limits(limit=10, in_flight=10)


@states("the bulkhead's limit = min(starts, the cap in flight)")
def test_the_bulkheads_limit_is_the_starts_under_the_cap_in_flight() -> None:
    """Starts at 12 under a cap in flight of 8 (the engine's slots): the bulkhead's limit is 8."""
    law = started_law(40)
    assert law.starts is not None
    law.starts.hold_within(12)
    assert law.limits(permits=10, worst_case_only=False).limit == 12
    assert SloMode(Fixed(law)).step(PLAN, slots=8).limit == 8


@states("the engine cannot preempt: max(1, worst-case permits)")
def test_an_engine_that_cannot_preempt_starts_at_the_worst_case_permits() -> None:
    """Typical requests of 400 tokens would start at 250; without preemption, at the 10 permits."""
    assert start_limit(PLAN, 400, worst_case_only=False) == 250
    assert start_limit(PLAN, 400, worst_case_only=True) == 10


# --- last: every test above has registered the words it checks --------------------------------


@pytest.mark.parametrize("name", sorted(STATED))
def test_each_checked_behaviour_is_stated(name: str) -> None:
    """The words each behaviour test checks stand in the law's statement."""
    assert " ".join(STATED[name].split()) in law_section()
