"""The admission modes (SIDECAR_ADMISSION): one strategy object per mode, chosen once at start-up.

A mode answers, in its one unit: what a request costs, what one request of the whole token budget
costs (a request with no budget of its own, and the floor), the limits a plan gives (``step``:
the one call where its control law hears the plan, returning the ``Limits`` the control loop
pushes to the bulkhead: the limit and the cap on requests in flight), the largest request that
can ever run, and what must drain before a refused caller fits (its Retry-After).

- count: permits, one per sequence; the plan's worst-case permits (and the engine's slots).
- slo: a permit per stream until its first token (none after it, nor for a request that does not
  stream; a stream of n sequences starts as one): the limit counts streams starting at once,
  steered by their time to first token; a cap on requests in flight beside it is steered by the
  time per output token and what the KV cache holds (the engine's slots cap both).
- tokens: KV bytes; a request costs its own worst case; alpha x the pool's bytes.
- adaptive: tokens; a request costs what it holds plus its expected growth (its live
  ``StreamUsage``); the pool's tokens x alpha x the over-commit ratio; what can never run is what
  is bigger than the whole pool, since the limit grows back.

The control laws themselves (the SLO gradient, the over-commit AIMD) keep their evidence and their
log lines in ``sidecar.live``; a mode steps them through the small protocols below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sidecar.core.admission.decisions import AdmissionSnapshot, Mode
from sidecar.core.admission.ledger import StreamUsage, in_blocks
from sidecar.core.admission.machine import Admission
from sidecar.core.laws.slo_law import capped
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import KvCost, Plan
from sidecar.core.request.claims import Claims
from sidecar.core.request.request_checks import CheckedRequest
from sidecar.core.request.stream_timing import StreamTiming

Price = tuple[int, StreamUsage | None]  # (cost in the mode's unit, live usage if adaptive)


class AdmissionMode(Protocol):
    """One admission mode's prices, limit and refusals, in one unit."""

    name: Mode

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        """What ``request`` costs in ``compartment``, and its live usage where it has one."""
        ...

    def full_request(self, tokens: int, cost: KvCost) -> int:
        """One request of ``tokens`` (the whole budget) at its worst case; ``cost`` prices a
        token."""
        ...

    def step(self, plan: Plan, slots: int | None = None) -> Limits:
        """The limits for ``plan``, its law told of the plan (a law starts from the first one);
        ``slots``: the engine's fixed slots, where it has them (llama.cpp's ``-np``)."""
        ...

    def ceiling(self) -> int | None:
        """The largest worst case that can ever run; None: the limit's own reach (what cannot fit
        it is refused at once, one unit excepted: it waits)."""
        ...

    def must_drain(self, admission: Admission, compartment: str) -> int | None:
        """What must be released before a new caller in ``compartment`` fits, in the mode's
        unit; None: the hint counts the requests queued ahead instead."""
        ...

    def held_limit(self) -> int | None:
        """A limit that stands on the floor too, when the plan goes stale, where the mode has one
        that does not come from the plan (None: the floor's own)."""
        ...

    def started_cost(self) -> int | None:
        """What a stream holds once its first token came, where that is less than its price
        (slo's start gate: 0); None: it holds its price to the end."""
        ...

    def max_wait_s(self, claims: Claims) -> float | None:
        """How long a request with ``claims`` may wait for a permit (None: the bulkhead's own
        wait): its claimed TTL, or what its law allows."""
        ...

    def grows_fast(self, in_force: int) -> bool:
        """Whether a step now could raise the limit in force (``in_force``) by more than one:
        then a burst the limit binds on is worth a tick at once."""
        ...

    def in_flight_reach(self) -> int | None:
        """The most requests in flight the law could grow to while it grows fast (the SLO law:
        what the KV cache holds, its drain ceiling); None where nothing says."""
        ...

    def track(self, timing: StreamTiming, claims: Claims) -> None:
        """A stream is about to be relayed (its law samples its first token)."""
        ...

    def ended(self, timing: StreamTiming, completed: bool) -> None:
        """A relayed stream ended (its law samples its pace)."""
        ...

    def learn(self, usage: StreamUsage) -> None:
        """A request completed with ``usage`` (its law learns its length)."""
        ...

    def document(self, snapshot: AdmissionSnapshot) -> dict[str, Any]:
        """The mode's own section of /capacity, keyed by its law ("slo", "adaptive"); empty
        where the plan alone decides."""
        ...


class _Unsteered:
    """What a mode whose law hears nothing of the streams answers (count and tokens; adaptive
    learns lengths, slo hears the streams), and, unless it says otherwise, a mode with no
    ceiling, nothing to drain before a caller fits, no limit held between plans and no cost left
    once a stream started."""

    def max_wait_s(self, claims: Claims) -> float | None:
        return claims.max_wait_s

    def grows_fast(self, in_force: int) -> bool:
        return False

    def in_flight_reach(self) -> int | None:
        return None

    def track(self, timing: StreamTiming, claims: Claims) -> None:
        return None

    def ended(self, timing: StreamTiming, completed: bool) -> None:
        return None

    def learn(self, usage: StreamUsage) -> None:
        return None

    def document(self, snapshot: AdmissionSnapshot) -> dict[str, Any]:
        return {}

    def ceiling(self) -> int | None:
        return None

    def must_drain(self, admission: Admission, compartment: str) -> int | None:
        return None

    def held_limit(self) -> int | None:
        return None

    def started_cost(self) -> int | None:
        return None


class SteeredLimit(Protocol):
    """The SLO law, stepped on a plan: the requests in flight the streams' latencies allow
    (``Limits.in_flight``) and, of them, how many may be starting at once (``Limits.limit``);
    and the starts limit that stands without a plan (None: none)."""

    def step(self, plan: Plan) -> Limits: ...

    def hold_limit(self) -> int | None: ...

    def max_wait_s(self, claims: Claims) -> float: ...

    def grows_fast(self, in_force: int) -> bool: ...

    def in_flight_reach(self) -> int | None: ...

    def asked(self, tokens: int) -> None: ...

    def track(self, timing: StreamTiming, claims: Claims) -> None: ...

    def ended(self, timing: StreamTiming, completed: bool) -> None: ...

    def document(self) -> dict[str, Any]: ...


class OvercommitLaw(Protocol):
    """Adaptive admission's law, as its mode reads it: the over-committed limit in tokens, the
    pool as the ceiling, each request's learned footprint, the engine's slots."""

    block_size: int

    def step(self, plan: Plan) -> Limits: ...

    def ceiling(self) -> int | None: ...

    def usage_for(
        self, compartment: str, prompt_tokens: int, max_tokens: int, sequences: int
    ) -> StreamUsage: ...

    def learn(self, usage: StreamUsage) -> None: ...

    def document(self, snapshot: AdmissionSnapshot) -> dict[str, Any]: ...


class _Permits(_Unsteered):
    """Count and slo: a permit per sequence, each pinning a worst-case request's KV cache."""

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        return request.sequences, None

    def full_request(self, tokens: int, cost: KvCost) -> int:
        return 1


def _capped(limit: int, *caps: int | None) -> int:
    return min([limit, *(c for c in caps if c is not None)])


class CountMode(_Permits):
    """The plan's permits, capped by SIDECAR_MAX_CONCURRENT_CALLS and the engine's slots."""

    name: Mode = "count"

    def __init__(self, cap: int | None = None) -> None:
        self.cap = cap

    def step(self, plan: Plan, slots: int | None = None) -> Limits:
        # The limit counts requests: the slots cap it already, no cap in flight beside it.
        return Limits(limit=_capped(plan.permits, self.cap, slots))


class SloMode(_Permits):
    """Two limits the streams' latencies steer: the bulkhead's limit counts streams starting
    (a permit per stream until its first token), the cap on requests in flight counts
    every request; both capped like count's."""

    name: Mode = "slo"

    def __init__(self, law: SteeredLimit, cap: int | None = None) -> None:
        self.law = law
        self.cap = cap

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        # A request that does not stream shows no first token: it is held by the cap on
        # requests in flight alone. A stream of n sequences starts as one: its prefill is one.
        # What it asks for at its worst tells a fresh law what a request holds.
        self.law.asked(request.total_tokens)
        return (1 if request.stream else 0), None

    def step(self, plan: Plan, slots: int | None = None) -> Limits:
        return capped(self.law.step(plan), self.cap, slots)

    def held_limit(self) -> int | None:
        return self.law.hold_limit()  # steered by the streams the sidecar relays, not the plan

    def started_cost(self) -> int | None:
        return 0

    def max_wait_s(self, claims: Claims) -> float | None:
        return self.law.max_wait_s(claims)

    def grows_fast(self, in_force: int) -> bool:
        return self.law.grows_fast(in_force)

    def in_flight_reach(self) -> int | None:
        return self.law.in_flight_reach()

    def track(self, timing: StreamTiming, claims: Claims) -> None:
        self.law.track(timing, claims)

    def ended(self, timing: StreamTiming, completed: bool) -> None:
        self.law.ended(timing, completed)

    def document(self, snapshot: AdmissionSnapshot) -> dict[str, Any]:
        return {"slo": self.law.document()}


class TokenMode(_Unsteered):
    """Each sequence's own worst case in KV bytes, against alpha x the pool's bytes."""

    name: Mode = "tokens"

    def __init__(self, cost_of: Callable[[], KvCost]) -> None:
        self.cost_of = cost_of  # the plan's: the engine's or the model's pricing of a token

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        tokens = request.prompt_tokens + request.completion_tokens
        return self.cost_of().request_bytes(tokens) * request.sequences, None

    def full_request(self, tokens: int, cost: KvCost) -> int:
        return cost.request_bytes(tokens)

    def step(self, plan: Plan, slots: int | None = None) -> Limits:
        return Limits(limit=plan.admissible_bytes)


class AdaptiveMode(_Unsteered):
    """What a stream holds plus its learned growth, in tokens, against the over-committed pool."""

    name: Mode = "adaptive"

    def __init__(self, law: OvercommitLaw, resolve: Callable[[str], str] = str) -> None:
        self.law = law
        self.resolve = resolve  # a compartment key to the compartment its lengths are kept in

    def price(self, request: CheckedRequest, compartment: str) -> Price:
        usage = self.law.usage_for(
            self.resolve(compartment),
            request.prompt_tokens,
            request.completion_tokens,
            request.sequences,
        )
        return usage.charge(), usage

    def full_request(self, tokens: int, cost: KvCost) -> int:
        return in_blocks(tokens, self.law.block_size)

    def step(self, plan: Plan, slots: int | None = None) -> Limits:
        return self.law.step(plan)  # its slots cap requests in flight, not the tokens

    def ceiling(self) -> int | None:
        return self.law.ceiling()

    def must_drain(self, admission: Admission, compartment: str) -> int | None:
        # Tokens that must drain before this caller fits: those ahead, beyond the limit.
        ahead = admission.queued_cost_ahead(compartment) + admission.in_use_cost
        return max(1, ahead - admission.limit + 1)

    def learn(self, usage: StreamUsage) -> None:
        self.law.learn(usage)

    def document(self, snapshot: AdmissionSnapshot) -> dict[str, Any]:
        return {"adaptive": self.law.document(snapshot)}
