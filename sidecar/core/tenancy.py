"""Which compartment a request belongs to, read from its headers.

llm-d's router (its endpoint picker; the names are llm-d-inference-scheduler's
pkg/epp/metadata/consts.go at commit 520af47, unchanged since Gateway API Inference Extension
v1.5.0) passes on two client headers the sidecar honours: ``x-gateway-inference-fairness-id`` names
the tenant when no tenant header does, and ``x-gateway-inference-objective`` names the priority
class (an InferenceObjective) when no priority header does. An objective is sheddable when listed
so, or when its priority (copied from the InferenceObjective's ``spec.priority``) is negative, the
router's own rule (pkg/epp/util/request/sheddable.go): it never waits in the queue, and when the pod
is full it is turned away first. ``x-slo-ttft-ms`` (the router's latency-SLO header) caps how long a
request may wait in the queue: past it the target is missed anyway, so it is told at once.

An API key is a secret: it becomes ``key-`` + 12 hex digits of its SHA-256 here and is never kept,
returned or logged in clear. Header values are trimmed and bounded so a hostile client cannot mint
unbounded label values (unknown keys land in ``default`` anyway; see ``compartments``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Literal

from sidecar.core.compartments import DEFAULT

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_LEN = 64
_BEARER = "bearer "
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
OBJECTIVE_HEADER = "x-gateway-inference-objective"
TTFT_SLO_HEADER = "x-slo-ttft-ms"
TPOT_SLO_HEADER = "x-slo-tpot-ms"  # read by the router's latency predictor; the sidecar ignores it


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup that also works for a plain dict (aiohttp's headers already are)."""
    value = headers.get(name)
    if value is None and isinstance(headers, dict):  # a multidict's get() was case-blind already
        wanted = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    return value


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    cleaned = _SAFE.sub("_", value.strip())[:_MAX_LEN]
    return cleaned or None


def hash_api_key(key: str) -> str:
    """The public name of an API key: ``key-`` + the first 12 hex digits of its SHA-256."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def tenant_id(
    headers: Mapping[str, str],
    *,
    tenant_header: str = "x-tenant-id",
    from_api_key: bool = True,
) -> str | None:
    """The tenant of a request: the tenant header if set, else the gateway's fairness id, else the
    hashed bearer key, else None."""
    declared = _clean(_header(headers, tenant_header)) or _clean(_header(headers, FAIRNESS_HEADER))
    if declared is not None:
        return declared
    if not from_api_key:
        return None
    auth = _header(headers, "authorization") or ""
    if not auth.lower().startswith(_BEARER):
        return None
    key = auth[len(_BEARER) :].strip()
    return hash_api_key(key) if key else None


def compartment_key(
    headers: Mapping[str, str],
    tenant: str | None,
    *,
    by: Literal["tenant", "priority"] = "tenant",
    priority_header: str = "x-priority",
) -> str:
    """The compartment key of a request whose tenant (``tenant_id``) is ``tenant``: that tenant,
    or its priority class, or ``default`` when the request names none. The caller has the tenant
    already (the request's log context), so it is derived once a request."""
    if by == "priority":
        priority = priority_class(headers, priority_header)
        return priority or DEFAULT
    return tenant or DEFAULT


def priority_class(headers: Mapping[str, str], priority_header: str = "x-priority") -> str | None:
    """The priority class: the priority header if set, else the gateway's objective, lower-cased."""
    named = _clean(_header(headers, priority_header)) or _clean(_header(headers, OBJECTIVE_HEADER))
    return named.lower() if named else None


def is_sheddable(
    headers: Mapping[str, str],
    sheddable: frozenset[str],
    priority_header: str = "x-priority",
    priorities: Mapping[str, int] | None = None,
) -> bool:
    """Whether the request's priority class is one that is shed rather than queued: listed as
    sheddable, or of a negative priority (``priorities``: class -> InferenceObjective priority)."""
    if not sheddable and not priorities:
        return False
    named = priority_class(headers, priority_header)
    if named is None:
        return False
    return named in sheddable or (priorities or {}).get(named, 0) < 0


def queue_wait_cap_s(headers: Mapping[str, str]) -> float | None:
    """The request's TTFT target (``x-slo-ttft-ms``) in seconds, as the longest it should wait
    for a permit; None where absent or not a whole number of milliseconds >= 0."""
    value = (_header(headers, TTFT_SLO_HEADER) or "").strip()
    if not value.isdigit() or len(value) > 9:  # > 11 days is no target; digits only, no sign
        return None
    return int(value) / 1000


def parse_priorities(text: str | None) -> dict[str, int]:
    """``name=priority,...`` (each InferenceObjective's name and spec.priority); ValueError names
    the entry that is not one."""
    priorities: dict[str, int] = {}
    for entry in filter(None, (part.strip() for part in (text or "").split(","))):
        name, _, number = entry.partition("=")
        cleaned = _clean(name)
        try:
            priority = int(number.strip())
        except ValueError:
            cleaned = None
        if cleaned is None:
            raise ValueError(f"{entry!r} is not name=priority (an integer, e.g. batch=-1)")
        priorities[cleaned.lower()] = priority
    return priorities


def parse_names(text: str | None) -> frozenset[str]:
    """A comma-separated list of class names, cleaned and lower-cased as requests' are."""
    names = (_clean(part) for part in (text or "").split(","))
    return frozenset(name.lower() for name in names if name)
