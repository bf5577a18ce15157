"""Tenant and compartment keys from request headers; API keys never appear in clear."""

from __future__ import annotations

import hashlib

import pytest

from sidecar.core.admission.tenancy import (
    compartment_key,
    hash_api_key,
    is_sheddable,
    parse_names,
    parse_priorities,
    tenant_id,
)
from sidecar.core.request.claims import ClaimNames, read_claims

SECRET = "sk-live-do-not-leak-0123456789"
HASHED = "key-" + hashlib.sha256(SECRET.encode()).hexdigest()[:12]


@pytest.mark.parametrize(
    ("headers", "kwargs", "expected"),
    [
        pytest.param({"x-tenant-id": "acme"}, {}, "acme", id="tenant-header"),
        pytest.param({"X-Tenant-ID": "acme"}, {}, "acme", id="header-any-case"),
        pytest.param({"Authorization": f"Bearer {SECRET}"}, {}, HASHED, id="api-key-hashed"),
        pytest.param({"authorization": f"bearer  {SECRET} "}, {}, HASHED, id="bearer-any-case"),
        pytest.param(
            {"x-tenant-id": "acme", "authorization": f"Bearer {SECRET}"},
            {},
            HASHED,
            id="key-wins-over-header",
        ),
        pytest.param(
            {"x-tenant-id": "acme", "authorization": f"Bearer {SECRET}"},
            {"from_api_key": False},
            "acme",
            id="header-where-keys-name-no-tenant",
        ),
        pytest.param(
            {"authorization": f"Bearer {SECRET}"},
            {"from_api_key": False},
            None,
            id="key-ignored-when-off",
        ),
        pytest.param({"authorization": "Basic abc"}, {}, None, id="not-bearer"),
        pytest.param({"authorization": "Bearer "}, {}, None, id="empty-key"),
        pytest.param({}, {}, None, id="nothing"),
        pytest.param({"x-org": "acme"}, {"tenant": "X-Org"}, "acme", id="custom-header"),
        pytest.param({"x-tenant-id": "a b/../c"}, {}, "a_b_.._c", id="unsafe-chars-replaced"),
        pytest.param({"x-tenant-id": "t" * 500}, {}, "t" * 64, id="bounded-length"),
        pytest.param({"x-tenant-id": "  "}, {}, None, id="blank-header"),
        pytest.param(
            {"x-gateway-inference-fairness-id": "team-a", "authorization": f"Bearer {SECRET}"},
            {},
            HASHED,
            id="key-before-gateway-fairness-id",
        ),
        pytest.param({"x-llm-d-inference-fairness-id": "team-b"}, {}, "team-b", id="fairness-id"),
        pytest.param(
            {"x-tenant-id": "acme", "x-gateway-inference-fairness-id": "team-a"},
            {},
            "acme",
            id="tenant-header-before-fairness-id",
        ),
    ],
)
def test_tenant_id(
    headers: dict[str, str], kwargs: dict[str, object], expected: str | None
) -> None:
    """The tenant is a hash of the bearer key, else the header's, else nobody."""
    names = ClaimNames(tenant=str(kwargs.pop("tenant", "x-tenant-id")))
    claims = read_claims(headers, names)
    assert tenant_id(headers, claims, **kwargs) == expected  # type: ignore[arg-type]


def test_api_key_never_returned_in_clear() -> None:
    """The key itself, or any long piece of it, never appears in the tenant id."""
    headers = {"authorization": f"Bearer {SECRET}"}
    key = tenant_id(headers, read_claims(headers))
    assert key is not None
    assert SECRET not in key
    assert SECRET[3:15] not in key
    assert key == hash_api_key(SECRET)
    assert len(key) == len("key-") + 12


@pytest.mark.parametrize(
    ("headers", "by", "expected"),
    [
        pytest.param({"x-tenant-id": "acme"}, "tenant", "acme", id="tenant"),
        pytest.param({}, "tenant", "default", id="no-tenant-is-default"),
        pytest.param({"x-priority": "HIGH"}, "priority", "high", id="priority-lowercased"),
        pytest.param({"x-tenant-id": "acme"}, "priority", "default", id="priority-ignores-tenant"),
        pytest.param({}, "priority", "default", id="no-priority-is-default"),
        pytest.param(
            {"x-gateway-inference-objective": "Batch"}, "priority", "batch", id="gateway-objective"
        ),
        pytest.param(
            {"x-priority": "high", "x-gateway-inference-objective": "batch"},
            "priority",
            "high",
            id="priority-header-before-objective",
        ),
    ],
)
def test_compartment_key(headers: dict[str, str], by: str, expected: str) -> None:
    """Compartments follow the configured dimension, falling back to default."""
    claims = read_claims(headers)
    key = compartment_key(claims, tenant_id(headers, claims), by=by)  # type: ignore[arg-type]
    assert key == expected


@pytest.mark.parametrize(
    ("headers", "sheddable", "expected"),
    [
        pytest.param({"x-gateway-inference-objective": "batch"}, "batch", True, id="objective"),
        pytest.param({"x-priority": "BATCH"}, "Batch, bulk", True, id="priority-any-case"),
        pytest.param({"x-gateway-inference-objective": "chat"}, "batch", False, id="other-class"),
        pytest.param({}, "batch", False, id="no-class"),
        pytest.param({"x-priority": "batch"}, None, False, id="nothing-sheddable"),
    ],
)
def test_is_sheddable(headers: dict[str, str], sheddable: str | None, expected: bool) -> None:
    """Only the configured priority classes are shed instead of queued."""
    assert is_sheddable(read_claims(headers), parse_names(sheddable)) is expected


def test_parse_names_cleans_like_requests() -> None:
    """Configured names are trimmed, lower-cased and stripped of empties, as header values are."""
    assert parse_names(" Batch,,bulk , ") == frozenset({"batch", "bulk"})


OBJECTIVE = "x-gateway-inference-objective"


@pytest.mark.parametrize(
    ("headers", "sheddable", "expected"),
    [
        pytest.param({OBJECTIVE: "batch"}, frozenset(), True, id="negative-priority"),
        pytest.param({OBJECTIVE: "Batch"}, frozenset(), True, id="objective-case-blind"),
        pytest.param({OBJECTIVE: "chat"}, frozenset(), False, id="positive-priority"),
        pytest.param({OBJECTIVE: "zero"}, frozenset(), False, id="priority-zero"),
        pytest.param({OBJECTIVE: "unknown"}, frozenset(), False, id="unknown-is-zero"),
        pytest.param({OBJECTIVE: "chat"}, frozenset({"chat"}), True, id="listed-wins"),
        pytest.param({"x-priority": "batch"}, frozenset(), True, id="priority-header"),
        pytest.param({}, frozenset(), False, id="no-class"),
    ],
)
def test_a_negative_objective_priority_is_sheddable(
    headers: dict[str, str], sheddable: frozenset[str], expected: bool
) -> None:
    """llm-d's rule: priority < 0 is sheddable; an objective not listed has priority 0."""
    priorities = {"batch": -1, "chat": 10, "zero": 0}
    assert is_sheddable(read_claims(headers), sheddable, priorities=priorities) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("chat=10,batch=-1", {"chat": 10, "batch": -1}, id="two"),
        pytest.param(" Chat = 3 , ", {"chat": 3}, id="spaces-case-trailing-comma"),
        pytest.param(None, {}, id="unset"),
    ],
)
def test_parse_priorities(text: str | None, expected: dict[str, int]) -> None:
    """Objective names are cleaned and lower-cased as requests' are."""
    assert parse_priorities(text) == expected


@pytest.mark.parametrize("text", ["chat", "chat=high", "=3", "chat=1.5"])
def test_parse_priorities_names_the_bad_entry(text: str) -> None:
    """Each malformed entry is refused, naming itself."""
    with pytest.raises(ValueError, match="not name=priority"):
        parse_priorities(text)
