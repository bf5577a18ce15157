"""The project's exception hierarchy; every error the sidecar raises on purpose is one of these.

SidecarError
├── ConfigError               a setting or planner input is wrong (start-up / CLI, exit 2)
│   └── ModelConfigError      a model config.json is missing, unreadable or unsupported
├── PlanError                 the numbers cannot give a plan (weights + overhead >= VRAM)
├── ProbeError                reading the GPU or the engine failed
│   ├── ProbeTemporaryError   worth retrying on the next tick (engine restarting, GPU busy)
│   └── ProbeUnavailableError will not get better by retrying (no driver, not supported)
├── AdmissionRejectedError         the bulkhead said no (queue full, wait timed out, draining...)
├── RequestError              the client's request is invalid (4xx, OpenAI-shaped body)
├── EdgeRefusedError          the bounded edge refused or ended it (busy, too slow, stalled)
├── IllegalTransitionError    a connection's state table has no row for (state, event): a bug
└── UpstreamError             the engine could not be reached or did not answer in time
    ├── UpstreamUnavailableError  502
    └── UpstreamTimeoutError      504
"""

from __future__ import annotations

from sidecar.core.outcomes import (
    EDGE_FAULTS,
    REJECTIONS,
    UPSTREAM_FAILURES,
    EdgeFault,
    RejectReason,
    UpstreamFailure,
)


class SidecarError(Exception):
    """Root of every error the sidecar raises on purpose."""


class ConfigError(SidecarError):
    """A setting or planner input is invalid; the message names it."""


class ModelConfigError(ConfigError):
    """A model's config.json is missing, unreadable or describes something we cannot size."""


class PlanError(SidecarError):
    """The declared or measured memory leaves no room for a KV pool."""


class ProbeError(SidecarError):
    """Reading the GPU or the engine failed."""


class ProbeTemporaryError(ProbeError):
    """A probe failure that may clear by itself; the control loop retries on its next tick."""


class ProbeUnavailableError(ProbeError):
    """A probe failure that retrying will not fix (no driver, unsupported call, no permission)."""


class AdmissionRejectedError(SidecarError):
    """The bulkhead refused a request; ``reason`` says why, ``retry_after_s`` when to come back,
    ``waited_s`` how long it had waited in the queue first (0 when refused at once)."""

    def __init__(self, reason: RejectReason, retry_after_s: float, waited_s: float = 0.0) -> None:
        self.refusal = REJECTIONS[reason]
        super().__init__(self.refusal.message)
        self.reason: RejectReason = reason
        self.message = self.refusal.message
        self.retry_after_s = retry_after_s
        self.waited_s = waited_s


class RequestError(SidecarError):
    """The client's request is invalid; carries what the OpenAI-shaped error body needs."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str = "invalid_request",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code


class EdgeRefusedError(SidecarError):
    """The edge's own bounds refused the request; ``fault`` is its row in the outcome table."""

    def __init__(self, fault: EdgeFault, retry_after_s: float = 1.0) -> None:
        self.refusal = EDGE_FAULTS[fault]
        super().__init__(self.refusal.message)
        self.fault: EdgeFault = fault
        self.retry_after_s = retry_after_s  # when the edge expects room (a 503's Retry-After)


class IllegalTransitionError(SidecarError):
    """A connection was asked to move by an event its state table does not allow from where it
    is: a bug in the connection's protocol code, never the peer's doing."""

    def __init__(self, state: object, event: object) -> None:
        super().__init__(f"no transition from {state} on {event}")
        self.state = state
        self.event = event


class UpstreamError(SidecarError):
    """The engine failed us; ``failure`` is its row in the outcome table."""

    failure: UpstreamFailure = "upstream_unavailable"

    def __init__(self, detail: str | None = None) -> None:
        self.refusal = UPSTREAM_FAILURES[self.failure]
        super().__init__(self.refusal.message + (f": {detail}" if detail else ""))


class UpstreamUnavailableError(UpstreamError):
    """The engine could not be reached or reset the connection (502)."""

    failure: UpstreamFailure = "upstream_unavailable"


class UpstreamTimeoutError(UpstreamError):
    """The engine did not answer within the configured timeout (504)."""

    failure: UpstreamFailure = "upstream_timeout"
