"""What a request claims about itself in its headers: its tenant, its objective (priority class),
its latency targets and its queue time-to-live; read in one place, from a peer the operator trusts
(pure, no I/O).

The names are llm-d's router's (llm-d-router ``pkg/epp/metadata/consts.go`` at commit 04c854a):
the current ``x-llm-d-*`` name is read first, its deprecated alias (``x-gateway-inference-*``,
``x-slo-*``) only where the current one is absent, as the router's own lookup does. A claim is a
request asking for more than it may have been given (a tenant's reserve, a priority, a longer
wait), so a peer the operator did not name is read as claiming nothing (:class:`ClaimTrust`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

# (current name, deprecated alias...): the first one present wins.
FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
TTFT_SLO_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
TPOT_SLO_HEADERS = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")
TTL_HEADERS = ("x-llm-d-inference-ttl",)  # a Go duration (time.ParseDuration), e.g. 1500ms

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 64
_MAX_MS_DIGITS = 9  # > 11 days is no target
# Go's duration syntax: one or more (decimal number, unit) pairs, an optional sign ahead.
_DURATION = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_MAX_DURATION_TEXT = 64


@dataclass(frozen=True, slots=True)
class ClaimNames:
    """The operator's own header names (``SIDECAR_TENANT_HEADER``, ``SIDECAR_PRIORITY_HEADER``),
    read before llm-d's."""

    tenant: str = "x-tenant-id"
    priority: str = "x-priority"


@dataclass(frozen=True, slots=True, kw_only=True)
class Claims:
    """A request's claims, each None where it makes none (or is not trusted to)."""

    tenant: str | None = None  # cleaned: [A-Za-z0-9._-], at most 64 characters
    objective: str | None = None  # the priority class, cleaned and lower-cased
    ttft_slo_ms: int | None = None
    tpot_slo_ms: int | None = None
    ttl_s: float | None = None  # the longest it may wait in the queue

    @property
    def max_wait_s(self) -> float | None:
        """The longest this request should wait for a permit outside slo admission (whose law
        bounds the wait itself: ``SloControl.max_wait_s``): its TTL, or its TTFT target (past it
        the target is missed anyway), whichever is shorter; None where it says neither."""
        limits = [s for s in (self.ttl_s, _ms_to_s(self.ttft_slo_ms)) if s is not None]
        return min(limits) if limits else None


NO_CLAIMS = Claims()


def read_claims(headers: Mapping[str, str], names: ClaimNames = ClaimNames()) -> Claims:
    """Every claim ``headers`` make, parsed; a malformed value is read as absent."""
    return Claims(
        tenant=clean_name(first(headers, (names.tenant, *FAIRNESS_HEADERS))),
        objective=_lower(clean_name(first(headers, (names.priority, *OBJECTIVE_HEADERS)))),
        ttft_slo_ms=_milliseconds(first(headers, TTFT_SLO_HEADERS)),
        tpot_slo_ms=_milliseconds(first(headers, TPOT_SLO_HEADERS)),
        ttl_s=parse_go_duration(first(headers, TTL_HEADERS)),
    )


@dataclass(frozen=True, slots=True)
class ClaimTrust:
    """Which peers' claims are honoured (``SIDECAR_CLAIMS_FROM``): none, every one, or those in
    a list of networks (the gateway that strips and sets the headers)."""

    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    everyone: bool = False

    @property
    def trusts_anyone(self) -> bool:
        """Whether some peer may claim at all."""
        return self.everyone or bool(self.networks)

    def trusts(self, peer: str | None) -> bool:
        """Whether a request from ``peer`` (an IP address; None: unknown) may claim."""
        if self.everyone:
            return True
        if not peer or not self.networks:
            return False
        try:
            address = ipaddress.ip_address(peer.partition("%")[0])  # an IPv6 zone is no address
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
        return any(address in network for network in self.networks)

    def claims(self, headers: Mapping[str, str], peer: str | None, names: ClaimNames) -> Claims:
        """What a request from ``peer`` claims, as far as it is trusted to."""
        return read_claims(headers, names) if self.trusts(peer) else NO_CLAIMS


def parse_claim_trust(text: str | None) -> ClaimTrust:
    """``none`` (or unset), ``any``, or comma-separated networks (``10.0.0.0/8,fd00::/8``, a bare
    address is a /32 or /128); ValueError names the entry that is not one."""
    value = (text or "").strip().lower()
    if value in ("", "none"):
        return ClaimTrust()
    if value == "any":
        return ClaimTrust(everyone=True)
    networks = []
    for entry in filter(None, (part.strip() for part in value.split(","))):
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            msg = f"{entry!r} is not a network (e.g. 10.0.0.0/8 or fd00::/8), 'any' or 'none'"
            raise ValueError(msg) from None
    return ClaimTrust(tuple(networks))


def first(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` that ``headers`` carry (case-blind)."""
    for name in names:
        value = header(headers, name)
        if value is not None:
            return value
    return None


def header(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup that also works for a plain dict (a multidict's get() is already)."""
    value = headers.get(name)
    if value is None and isinstance(headers, dict):
        wanted = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    return value


def clean_name(value: str | None) -> str | None:
    """A name as a label may carry it: trimmed, [A-Za-z0-9._-] only, at most 64 characters."""
    if value is None:
        return None
    cleaned = _SAFE.sub("_", value.strip())[:_MAX_NAME]
    return cleaned or None


def parse_go_duration(text: str | None) -> float | None:
    """A positive Go duration (``1500ms``, ``1m30s``, ``.5h``) in seconds; None otherwise, as the
    router ignores a header it cannot read (zero and negative included)."""
    value = (text or "").strip()
    if len(value) > _MAX_DURATION_TEXT or not _DURATION.fullmatch(value):
        return None
    if value[0] == "-":
        return None
    seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION_PART.findall(value))
    return seconds if 0 < seconds < float("inf") else None


def _milliseconds(text: str | None) -> int | None:
    """A whole number of milliseconds >= 0; None where absent or anything else."""
    value = (text or "").strip()
    if not value.isascii() or not value.isdigit() or len(value) > _MAX_MS_DIGITS:
        return None
    return int(value)


def _ms_to_s(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _lower(value: str | None) -> str | None:
    return value.lower() if value is not None else None
