"""What the proxy asks of the rest of the sidecar about each request, as one object: who it is,
what it may spend and costs, how long it may wait, and what it tells back as the request runs.

The composition root implements it (``sidecar.entry.policy``) over the admission mode, the control
law and the metrics; the proxy sees only this protocol, so it never imports the layers below it
that steer the limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from sidecar.core.admission.ledger import StreamUsage
from sidecar.core.outcomes import EdgeFault
from sidecar.core.request.claims import Claims
from sidecar.core.request.request_checks import CheckedRequest, TokenPolicy
from sidecar.core.request.stream_timing import StreamTiming


class ProxyPolicy(Protocol):
    """Admission, pricing and limits for the proxy's requests."""

    # --- who the request is ----------------------------------------------------------------------

    def claims_of(self, headers: Mapping[str, str], peer: str | None) -> Claims:
        """What the request claims in its headers, as far as ``peer`` (its IP) is trusted to."""
        ...

    def tenant_of(self, headers: Mapping[str, str], claims: Claims) -> str | None:
        """The request's tenant (an API key's, hashed, before a claimed one)."""
        ...

    def compartment_of(self, claims: Claims, tenant: str | None) -> str:
        """The compartment key admission files the request under."""
        ...

    def sheddable(self, claims: Claims) -> bool:
        """Whether the request is refused at once rather than queued when there is no room."""
        ...

    # --- what it may spend and what it costs -----------------------------------------------------

    def budget(self) -> TokenPolicy:
        """The token budget in force (it follows the engine's limits)."""
        ...

    def price(self, request: CheckedRequest, compartment: str) -> tuple[int, StreamUsage | None]:
        """A checked request's cost in the admission mode's unit, and its live footprint
        (adaptive)."""
        ...

    def flat_price(self) -> int:
        """What a request with no token budget of its own costs: one full-budget request."""
        ...

    def max_wait_of(self, claims: Claims) -> float | None:
        """The longest the request may wait for a permit (None: the bulkhead's own wait)."""
        ...

    # --- what the proxy tells back ---------------------------------------------------------------

    def track(self, timing: StreamTiming, arrived: float, claims: Claims) -> None:
        """A stream is about to be relayed: its timing, stamped as tokens come, and when it
        arrived."""
        ...

    def timed(self, timing: StreamTiming, arrived: float, outcome: str) -> None:
        """A tracked stream ended: its timing, when it arrived, and how it ended."""
        ...

    def learn(self, usage: StreamUsage) -> None:
        """A request completed: what its real length teaches (adaptive)."""
        ...

    def log_refusal(self, fault: EdgeFault) -> None:
        """An edge refusal (a budget full, a body too slow): logged once per burst."""
        ...
