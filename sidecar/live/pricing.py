"""How requests are priced and what the limit is, one object per admission mode, chosen once.

A mode is three answers in one unit: what one request costs, what the limit is for a plan, and
what one full-budget request costs (a request with no token budget of its own, and the floor).

- count: permits; a request costs a permit per sequence; the plan's permits.
- tokens: KV bytes; a request costs its own worst case; alpha x pool bytes.
- adaptive: tokens; a request costs what it holds plus its expected growth (its live
  ``StreamUsage``); pool tokens x alpha x the over-commit ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sidecar.core.capacity import KvCost, Plan
from sidecar.core.decisions import Mode
from sidecar.core.ledger import StreamUsage, in_blocks
from sidecar.core.request_checks import CheckedRequest
from sidecar.live.adaptive import AdaptiveCapacity
from sidecar.live.slo import SloControl

Price = tuple[int, StreamUsage | None]  # (cost in the mode's unit, live usage if adaptive)


class Pricing(Protocol):
    """One admission mode's prices and limit."""

    mode: Mode

    def limit_of(self, plan: Plan) -> int:
        """The bulkhead's limit for ``plan``."""

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        """What ``request`` costs in ``compartment``."""

    def full_request(self, tokens: int, cost: KvCost) -> int:
        """One request of ``tokens`` (the whole budget) at its worst case; ``cost`` prices a
        token."""


class CountPricing:
    """A permit per sequence; the plan's permits, capped by SIDECAR_MAX_CONCURRENT_CALLS."""

    mode: Mode = "count"

    def __init__(self, cap: int | None = None) -> None:
        self.cap = cap

    def limit_of(self, plan: Plan) -> int:
        return plan.permits if self.cap is None else min(plan.permits, self.cap)

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        # Each sequence (`n`, a batch's prompts) pins a worst-case request's KV cache.
        return request.sequences, None

    def full_request(self, tokens: int, cost: KvCost) -> int:
        return 1


class SloPricing:
    """A permit per sequence, against the limit the streams' latencies steer."""

    mode: Mode = "slo"

    def __init__(self, control: SloControl, cap: int | None = None) -> None:
        self.control = control
        self.cap = cap

    def limit_of(self, plan: Plan) -> int:
        limit = self.control.limit_of(plan)
        return limit if self.cap is None else min(limit, self.cap)

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        return request.sequences, None

    def full_request(self, tokens: int, cost: KvCost) -> int:
        return 1


class TokenPricing:
    """Each sequence's own worst case in KV bytes, against alpha x the pool."""

    mode: Mode = "tokens"

    def __init__(self, cost_of: Callable[[], KvCost]) -> None:
        self.cost_of = cost_of  # the controller's: the engine's or the model's, as planned

    def limit_of(self, plan: Plan) -> int:
        return plan.admissible_bytes

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        tokens = request.prompt_tokens + request.completion_tokens
        return self.cost_of().request_bytes(tokens) * request.sequences, None

    def full_request(self, tokens: int, cost: KvCost) -> int:
        return cost.request_bytes(tokens)


class AdaptivePricing:
    """What a stream holds plus its learned growth, in tokens, against the steered limit."""

    mode: Mode = "adaptive"

    def __init__(self, adaptive: AdaptiveCapacity, resolve: Callable[[str], str]) -> None:
        self.adaptive = adaptive
        self.resolve = resolve  # a compartment key to the compartment its lengths are kept in

    def limit_of(self, plan: Plan) -> int:
        return self.adaptive.limit_of(plan)

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        usage = self.adaptive.usage_for(
            self.resolve(compartment),
            request.prompt_tokens,
            request.completion_tokens,
            request.sequences,
        )
        return usage.charge(), usage

    def full_request(self, tokens: int, cost: KvCost) -> int:
        return in_blocks(tokens, self.adaptive.block_size)
