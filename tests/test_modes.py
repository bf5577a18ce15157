"""Each admission mode's prices and limit, from one strategy object per mode."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from sidecar.core.admission.estimator import EstimatorConfig
from sidecar.core.admission.ledger import StreamUsage
from sidecar.core.admission.modes import AdaptiveMode, AdmissionMode, CountMode, SloMode, TokenMode
from sidecar.core.errors import AdmissionRejectedError
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import Budget, Plan, Source, Term, engine_cost, make_plan
from sidecar.core.request.request_checks import CheckedRequest
from sidecar.limiter.bulkhead import Bulkhead
from sidecar.live.adaptive import AdaptiveCapacity
from tests.quiet_law import QuietLaw

COST = engine_cost(1024, 16)  # the tiny model: 1 KiB a token, 16-token blocks


def request(prompt: int = 100, completion: int = 28, sequences: int = 1) -> CheckedRequest:
    return CheckedRequest(
        body=b"{}",
        stream=True,
        completion_tokens=completion,
        prompt_tokens=prompt,
        sequences=sequences,
        model=None,
    )


@pytest.mark.parametrize(
    ("sequences", "cost"),
    [pytest.param(1, 1, id="one-sequence-one-permit"), pytest.param(4, 4, id="n4-four-permits")],
)
def test_count_prices_a_permit_per_sequence(sequences: int, cost: int) -> None:
    """Each sequence pins a worst-case request's KV cache: a permit each; no live usage."""
    assert CountMode().price(request(sequences=sequences), "default") == (cost, None)
    assert CountMode().full_request(4096, COST) == 1


def test_tokens_prices_each_sequences_worst_case_in_bytes() -> None:
    """(100 + 28) tokens in whole 16-token blocks = 128 x 1 KiB; n=2 twice that."""
    pricing = TokenMode(lambda: COST)
    assert pricing.price(request(), "default") == (131_072, None)
    assert pricing.price(request(sequences=2), "default") == (262_144, None)
    assert pricing.full_request(128, COST) == 131_072


def test_adaptive_prices_the_live_usage_it_hands_the_bulkhead() -> None:
    """Unlearned, a request is charged its worst case in tokens, and the usage it returns is
    the one the ledger will follow; its compartment is the resolved one."""
    adaptive = AdaptiveCapacity(estimator=EstimatorConfig(min_samples=1, window=4))
    pricing = AdaptiveMode(adaptive, resolve=lambda key: f"resolved-{key}")
    cost, usage = pricing.price(request(), "gold")
    assert usage is not None
    assert (cost, usage.compartment, usage.worst()) == (128, "resolved-gold", 128)
    assert pricing.full_request(100, COST) == 100  # one-token blocks until a plan says more


# A pool of 100,000 one-byte tokens; a request of the budget holds 10,000 of them at worst.
PLAN = make_plan(
    engine_cost(1, None),
    Term(name="kv", bytes=100_000, source=Source.ENGINE),
    Budget(2_000, 8_000),
    1.0,
)


class Steered(QuietLaw):
    """The SLO law's output, fixed: it allows ``limit`` requests in flight, ``starts`` of them
    starting at once (all of them unless given)."""

    def __init__(self, limit: int, starts: int | None = None) -> None:
        self.limit = limit
        self.starts = limit if starts is None else starts

    def step(self, plan: Plan) -> Limits:
        return Limits(limit=min(self.limit, self.starts), in_flight=self.limit)

    def hold_limit(self) -> int | None:
        return self.starts


@pytest.mark.parametrize(
    ("mode", "slots", "limit"),
    [
        pytest.param(CountMode(), None, 10, id="count-the-plans-permits"),
        pytest.param(CountMode(), 4, 4, id="count-capped-by-the-engines-slots"),
        pytest.param(CountMode(cap=3), 8, 3, id="count-capped-by-max-concurrent-calls"),
        pytest.param(SloMode(Steered(50)), None, 50, id="slo-the-laws-limit"),
        pytest.param(SloMode(Steered(50, starts=12)), None, 12, id="slo-the-starts-limit"),
        pytest.param(SloMode(Steered(50), cap=20), 30, 20, id="slo-capped-by-the-setting"),
        pytest.param(SloMode(Steered(50), cap=20), 8, 8, id="slo-capped-by-the-slots"),
        pytest.param(TokenMode(lambda: COST), 4, 100_000, id="tokens-alpha-x-pool-bytes"),
        pytest.param(AdaptiveMode(AdaptiveCapacity()), 4, 100_000, id="adaptive-pool-x-ratio"),
    ],
)
def test_each_mode_derives_its_limit_from_the_plan(
    mode: AdmissionMode, slots: int | None, limit: int
) -> None:
    """Limits counted in requests are capped by the engine's slots; bytes and tokens are not."""
    assert mode.step(PLAN, slots).limit == limit


def test_only_adaptive_names_a_ceiling_and_caps_requests_by_the_slots() -> None:
    """Adaptive's limit grows back, so only a request beyond the whole pool can never run, and
    the engine's slots cap its requests in flight; the other modes' limit is their reach."""
    adaptive = AdaptiveCapacity()
    adaptive.slots = 4
    mode = AdaptiveMode(adaptive)
    assert (mode.step(PLAN).in_flight, mode.ceiling()) == (4, 100_000)
    for other in (CountMode(), TokenMode(lambda: COST)):
        assert (other.step(PLAN, slots=4).in_flight, other.ceiling()) == (None, None)
    assert SloMode(Steered(5)).ceiling() is None  # its cap in flight is the law's, below


@pytest.mark.parametrize(
    ("mode", "slots", "limit", "in_flight"),
    [
        pytest.param(SloMode(Steered(50, starts=12)), None, 12, 50, id="the-laws-two-limits"),
        pytest.param(SloMode(Steered(50, starts=12), cap=20), None, 12, 20, id="the-setting"),
        pytest.param(SloMode(Steered(50, starts=12), cap=20), 8, 8, 8, id="the-engines-slots"),
    ],
)
def test_slo_limits_streams_starting_and_caps_requests_in_flight(
    mode: SloMode, slots: int | None, limit: int, in_flight: int
) -> None:
    """slo's limit counts streams starting (the law's starts), its cap requests in flight (the
    law's in-flight limit); SIDECAR_MAX_CONCURRENT_CALLS and the engine's slots cap both."""
    assert mode.step(PLAN, slots) == Limits(limit=limit, in_flight=in_flight)


def test_slo_prices_a_stream_until_its_first_token_and_nothing_else() -> None:
    """A stream holds one permit of the starts limit until its first token, whatever its n; a
    request that does not stream shows no first token, so only the cap in flight holds it."""
    mode = SloMode(Steered(5))
    assert mode.price(request(sequences=4), "default") == (1, None)
    assert mode.price(replace(request(), stream=False), "default") == (0, None)
    assert mode.started_cost() == 0
    for other in (CountMode(), TokenMode(lambda: COST), AdaptiveMode(AdaptiveCapacity())):
        assert other.started_cost() is None


def test_only_slo_holds_its_limit_without_a_plan() -> None:
    """The SLO law's starts limit is steered by the streams, so it stands when the plan goes stale;
    every other mode's limit comes from the plan, and the floor's own stands instead."""
    assert SloMode(Steered(12)).held_limit() == 12
    for other in (CountMode(), TokenMode(lambda: COST), AdaptiveMode(AdaptiveCapacity())):
        assert other.held_limit() is None


async def test_adaptive_bulkhead_queues_past_the_limit_and_refuses_past_the_pool() -> None:
    """A worst case past the limit but within the pool waits for the limit to grow back; one
    past the pool is refused too_large at once."""
    adaptive = AdaptiveCapacity()
    mode = AdaptiveMode(adaptive)
    bulkhead = Bulkhead(limit=0, max_queue=4, max_wait_s=3.0, mode=mode)
    # alpha 0.001: the limit is one request of the budget, 10,000 tokens, of a 100,000 pool.
    bulkhead.resize(mode.step(replace(PLAN, alpha=0.001)))
    big = StreamUsage(compartment="default", prompt_tokens=15_000, max_tokens=5_000)
    waiter = asyncio.ensure_future(bulkhead.admit(big.worst(), usage=big).__aenter__())
    await asyncio.sleep(0)
    assert bulkhead.snapshot().queued == 1
    huge = StreamUsage(compartment="default", prompt_tokens=100_000, max_tokens=1)
    with pytest.raises(AdmissionRejectedError) as caught:
        await bulkhead.admit(huge.worst(), usage=huge).__aenter__()
    assert caught.value.reason == "too_large"
    bulkhead.drain()
    with pytest.raises(AdmissionRejectedError):
        await waiter
