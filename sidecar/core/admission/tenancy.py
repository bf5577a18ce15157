"""Which compartment a request belongs to, from its API key and what it may claim (pure, no I/O).

An API key is a secret: it becomes ``key-`` + 12 hex digits of its SHA-256 here and is never kept,
returned or logged in clear. It is also the one proof of who a client is, so its tenant wins over
any tenant a header claims (:mod:`sidecar.core.request.claims`, honoured only from a trusted peer).

An objective is sheddable when listed so, or when its priority (copied from the
InferenceObjective's ``spec.priority``) is negative, llm-d's router's own rule
(pkg/epp/util/request/sheddable.go): it never waits in the queue, and when the pod is full it is
turned away first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Literal

from sidecar.core.admission.compartments import DEFAULT
from sidecar.core.request.claims import Claims, clean_name, header

_BEARER = "bearer "


def hash_api_key(key: str) -> str:
    """The public name of an API key: ``key-`` + the first 12 hex digits of its SHA-256."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def api_key_tenant(headers: Mapping[str, str]) -> str | None:
    """The hashed bearer key of a request, or None where it has none."""
    auth = header(headers, "authorization") or ""
    if not auth.lower().startswith(_BEARER):
        return None
    key = auth[len(_BEARER) :].strip()
    return hash_api_key(key) if key else None


def tenant_id(
    headers: Mapping[str, str], claims: Claims, *, from_api_key: bool = True
) -> str | None:
    """The tenant of a request: its hashed bearer key (where keys name tenants), else the tenant
    it claims (a header, from a trusted peer), else None."""
    if from_api_key:
        keyed = api_key_tenant(headers)
        if keyed is not None:
            return keyed
    return claims.tenant


def compartment_key(
    claims: Claims, tenant: str | None, *, by: Literal["tenant", "priority"] = "tenant"
) -> str:
    """The compartment key of a request whose tenant (``tenant_id``) is ``tenant``: that tenant,
    or its objective (priority class), or ``default`` when it has none."""
    if by == "priority":
        return claims.objective or DEFAULT
    return tenant or DEFAULT


def is_sheddable(
    claims: Claims, sheddable: frozenset[str], priorities: Mapping[str, int] | None = None
) -> bool:
    """Whether the request's objective is one that is shed rather than queued: listed as
    sheddable, or of a negative priority (``priorities``: class -> InferenceObjective priority)."""
    named = claims.objective
    if named is None:
        return False
    return named in sheddable or (priorities or {}).get(named, 0) < 0


def parse_priorities(text: str | None) -> dict[str, int]:
    """``name=priority,...`` (each InferenceObjective's name and spec.priority); ValueError names
    the entry that is not one."""
    priorities: dict[str, int] = {}
    for entry in filter(None, (part.strip() for part in (text or "").split(","))):
        name, _, number = entry.partition("=")
        cleaned = clean_name(name)
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
    names = (clean_name(part) for part in (text or "").split(","))
    return frozenset(name.lower() for name in names if name)
