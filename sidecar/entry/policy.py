"""The proxy's policy as ``serve`` runs it: the SIDECAR_* settings on claims, tenants and
compartments, the admission mode's prices, the control law's waits, and the metrics it feeds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from sidecar.core.admission.ledger import StreamUsage
from sidecar.core.admission.modes import AdmissionMode
from sidecar.core.admission.tenancy import (
    compartment_key,
    is_sheddable,
    parse_names,
    parse_priorities,
    tenant_id,
)
from sidecar.core.outcomes import EdgeFault
from sidecar.core.plan.token_budget import TokenBudget
from sidecar.core.request.claims import ClaimNames, Claims, parse_claim_trust
from sidecar.core.request.request_checks import CheckedRequest, TokenPolicy
from sidecar.core.request.stream_timing import StreamTiming
from sidecar.entry.settings import Settings
from sidecar.live.control_loop import CapacityController
from sidecar.telemetry.metrics import RequestMetrics
from sidecar.telemetry.saturation_metrics import SaturationSignal


class SidecarPolicy:
    """Implements the proxy's ``ProxyPolicy`` over the parts ``serve`` built."""

    def __init__(
        self,
        settings: Settings,
        mode: AdmissionMode,
        controller: CapacityController,
        metrics: RequestMetrics,
        *,
        signal: SaturationSignal | None = None,
        log_refusal: Callable[[EdgeFault], None] = lambda _fault: None,
    ) -> None:
        s = self.settings = settings
        self.mode, self.controller, self.metrics = mode, controller, metrics
        self.signal = signal
        self.log_refusal = log_refusal
        self._claims = partial(
            parse_claim_trust(s.claims_from).claims,
            names=ClaimNames(s.tenant_header, s.priority_header),
        )
        self._sheddable = partial(
            is_sheddable,
            sheddable=parse_names(s.sheddable),
            priorities=parse_priorities(s.objective_priorities),
        )
        self._budget: tuple[TokenBudget, int | None, TokenPolicy] | None = None

    # --- who the request is ----------------------------------------------------------------------

    def claims_of(self, headers: Mapping[str, str], peer: str | None) -> Claims:
        return self._claims(headers, peer)

    def tenant_of(self, headers: Mapping[str, str], claims: Claims) -> str | None:
        return tenant_id(headers, claims, from_api_key=self.settings.tenant_from_api_key)

    def compartment_of(self, claims: Claims, tenant: str | None) -> str:
        return compartment_key(claims, tenant, by=self.settings.compartment_by)

    def sheddable(self, claims: Claims) -> bool:
        return self._sheddable(claims)

    # --- what it may spend and what it costs -----------------------------------------------------

    def budget(self) -> TokenPolicy:
        """The request checks' budget in force: the engine's limits, narrowed by the settings, and
        the plan's KV pool; made again only when either changes (the engine said its
        max_model_len, a plan its pool)."""
        budget, pool = self.controller.token_budget, self.controller.pool_tokens
        cached = self._budget
        if cached is not None and cached[0] is budget and cached[1] == pool:
            return cached[2]
        s = self.settings
        policy = TokenPolicy(
            max_prompt_tokens=budget.prompt_tokens,
            max_completion_tokens=budget.completion_tokens,
            over_budget=s.over_budget,
            prompt_bytes_per_token=s.prompt_bytes_per_token,
            media_tokens=s.media_prompt_tokens,
            count_from_engine=s.prompt_tokens == "engine",
            context_tokens=budget.context_tokens,
            fill_max_tokens=budget.fills_max_tokens,
            prompt_budget_exact_only=budget.prompt_origin == "engine",
            pool_tokens=pool,
        )
        self._budget = (budget, pool, policy)
        return policy

    def price(self, request: CheckedRequest, compartment: str) -> tuple[int, StreamUsage | None]:
        return self.mode.price(request, compartment)

    def flat_price(self) -> int:
        """A POST with no token budget of its own costs one full-budget request at its worst."""
        tokens = self.controller.token_budget.total_tokens
        return self.mode.full_request(tokens, self.controller.cost)

    def max_wait_of(self, claims: Claims) -> float | None:
        """The mode's bound: the SLO law's under slo, else what the request's claims say."""
        return self.mode.max_wait_s(claims)

    # --- what the proxy tells back ---------------------------------------------------------------

    def track(self, timing: StreamTiming, arrived: float, claims: Claims) -> None:
        """A stream about to be relayed -> the scale-out signal and the mode's law, which
        sample its first token as it comes."""
        if self.signal is not None:
            self.signal.track(timing, arrived)
        self.mode.track(timing, claims)

    def timed(self, timing: StreamTiming, arrived: float, outcome: str) -> None:
        """A relayed stream's timing -> the TTFT and TPOT histograms, the scale-out signal
        and the mode's law."""
        completed = outcome == "completed"
        self.metrics.streamed(timing, arrived, completed=completed)
        if self.signal is not None:
            self.signal.streamed(timing, arrived, completed)
        self.mode.ended(timing, completed)

    def learn(self, usage: StreamUsage) -> None:
        self.mode.learn(usage)
