"""Each admission mode's prices and limit, from one object: count, tokens and adaptive."""

from __future__ import annotations

import pytest

from sidecar.core.capacity import engine_cost
from sidecar.core.estimator import EstimatorConfig
from sidecar.core.request_checks import CheckedRequest
from sidecar.live.adaptive import AdaptiveCapacity
from sidecar.live.pricing import AdaptivePricing, CountPricing, TokenPricing

COST = engine_cost(1024, 16)  # the tiny model: 1 KiB a token, 16-token blocks


def request(prompt: int = 100, completion: int = 28, sequences: int = 1) -> CheckedRequest:
    return CheckedRequest(b"{}", stream=True, completion_tokens=completion,
                          prompt_tokens=prompt, sequences=sequences, model=None)  # fmt: skip


@pytest.mark.parametrize(
    ("sequences", "cost"),
    [pytest.param(1, 1, id="one-sequence-one-permit"), pytest.param(4, 4, id="n4-four-permits")],
)
def test_count_prices_a_permit_per_sequence(sequences: int, cost: int) -> None:
    """Each sequence pins a worst-case request's KV cache: a permit each; no live usage."""
    assert CountPricing().price(request(sequences=sequences), "default") == (cost, None)
    assert CountPricing().full_request(4096, COST) == 1


def test_tokens_prices_each_sequences_worst_case_in_bytes() -> None:
    """(100 + 28) tokens in whole 16-token blocks = 128 x 1 KiB; n=2 twice that."""
    pricing = TokenPricing(lambda: COST)
    assert pricing.price(request(), "default") == (131_072, None)
    assert pricing.price(request(sequences=2), "default") == (262_144, None)
    assert pricing.full_request(128, COST) == 131_072


def test_adaptive_prices_the_live_usage_it_hands_the_bulkhead() -> None:
    """Unlearned, a request is charged its worst case in tokens, and the usage it returns is
    the one the ledger will follow; its compartment is the resolved one."""
    adaptive = AdaptiveCapacity(estimator=EstimatorConfig(min_samples=1, window=4))
    pricing = AdaptivePricing(adaptive, resolve=lambda key: f"resolved-{key}")
    cost, usage = pricing.price(request(), "gold")
    assert usage is not None
    assert (cost, usage.compartment, usage.worst()) == (128, "resolved-gold", 128)
    assert pricing.full_request(100, COST) == 100  # one-token blocks until a plan says more
