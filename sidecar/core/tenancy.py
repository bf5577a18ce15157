"""Which compartment a request belongs to, read from its headers.

The Gateway API Inference Extension's endpoint picker forwards two headers the sidecar honours:
``x-gateway-inference-fairness-id`` names the tenant when no tenant header does, and
``x-gateway-inference-objective`` names the priority class (an InferenceObjective) when no priority
header does. Objectives listed as sheddable never wait in the queue: when the pod is full they are
turned away first, and the queue stays for everyone else.

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
    headers: Mapping[str, str], sheddable: frozenset[str], priority_header: str = "x-priority"
) -> bool:
    """Whether the request's priority class is one that is shed rather than queued."""
    return bool(sheddable) and priority_class(headers, priority_header) in sheddable


def parse_names(text: str | None) -> frozenset[str]:
    """A comma-separated list of class names, cleaned and lower-cased as requests' are."""
    names = (_clean(part) for part in (text or "").split(","))
    return frozenset(name.lower() for name in names if name)
