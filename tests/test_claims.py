"""What a request claims in its headers: llm-d's current names before their deprecated aliases,
values parsed or ignored, and nothing claimed from a peer the operator did not name."""

from __future__ import annotations

import pytest

from sidecar.core.request.claims import (
    NO_CLAIMS,
    ClaimNames,
    Claims,
    parse_claim_trust,
    parse_go_duration,
    read_claims,
)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param(
            {"x-llm-d-inference-fairness-id": "new", "x-gateway-inference-fairness-id": "old"},
            Claims(tenant="new"),
            id="fairness-current-before-alias",
        ),
        pytest.param(
            {"X-Gateway-Inference-Fairness-Id": "old"}, Claims(tenant="old"), id="fairness-alias"
        ),
        pytest.param(
            {"x-tenant-id": "mine", "x-llm-d-inference-fairness-id": "new"},
            Claims(tenant="mine"),
            id="operator-header-first",
        ),
        pytest.param(
            {"x-llm-d-inference-objective": "Chat", "x-gateway-inference-objective": "batch"},
            Claims(objective="chat"),
            id="objective-current-before-alias",
        ),
        pytest.param(
            {"x-gateway-inference-objective": "Batch"},
            Claims(objective="batch"),
            id="objective-alias",
        ),
        pytest.param(
            {"x-priority": "high", "x-llm-d-inference-objective": "batch"},
            Claims(objective="high"),
            id="priority-header-first",
        ),
        pytest.param(
            {"x-llm-d-slo-ttft-ms": "200", "x-slo-ttft-ms": "900"},
            Claims(ttft_slo_ms=200),
            id="ttft-current-before-alias",
        ),
        pytest.param({"x-slo-ttft-ms": "900"}, Claims(ttft_slo_ms=900), id="ttft-alias"),
        pytest.param(
            {"x-llm-d-slo-tpot-ms": "20", "x-slo-tpot-ms": "50"},
            Claims(tpot_slo_ms=20),
            id="tpot-current-before-alias",
        ),
        pytest.param({"x-slo-tpot-ms": "50"}, Claims(tpot_slo_ms=50), id="tpot-alias"),
        pytest.param({"x-llm-d-inference-ttl": " 2s "}, Claims(ttl_s=2.0), id="ttl"),
        pytest.param({"x-tenant-id": "t" * 500}, Claims(tenant="t" * 64), id="tenant-bounded"),
        pytest.param({"x-tenant-id": "a b/\xff"}, Claims(tenant="a_b__"), id="tenant-cleaned"),
        pytest.param({}, NO_CLAIMS, id="nothing"),
    ],
)
def test_read_claims(headers: dict[str, str], expected: Claims) -> None:
    """Each claim is read under its current name first, its alias after, the operator's first."""
    assert read_claims(headers) == expected


def test_the_operator_names_its_own_headers() -> None:
    """SIDECAR_TENANT_HEADER / SIDECAR_PRIORITY_HEADER replace x-tenant-id / x-priority."""
    headers = {"x-org": "acme", "x-class": "Gold", "x-tenant-id": "other"}
    claims = read_claims(headers, ClaimNames(tenant="X-Org", priority="x-class"))
    assert (claims.tenant, claims.objective) == ("acme", "gold")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("250", 250, id="ms"),
        pytest.param(" 0 ", 0, id="zero"),
        pytest.param("-5", None, id="negative"),
        pytest.param("1.5", None, id="fraction"),
        pytest.param("abc", None, id="text"),
        pytest.param("9" * 10, None, id="absurd"),
        pytest.param("\u0662\u0665", None, id="non-ascii-digits"),
        pytest.param("", None, id="empty"),
    ],
)
def test_the_ttft_target_is_whole_milliseconds(value: str, expected: int | None) -> None:
    """x-llm-d-slo-ttft-ms: whole milliseconds; anything else is no target."""
    assert read_claims({"x-llm-d-slo-ttft-ms": value}).ttft_slo_ms == expected


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("1500ms", 1.5, id="ms"),
        pytest.param("2s", 2.0, id="s"),
        pytest.param("1m30s", 90.0, id="compound"),
        pytest.param(".5h", 1800.0, id="leading-dot"),
        pytest.param("1.5m", 90.0, id="fraction"),
        pytest.param("+3s", 3.0, id="plus"),
        pytest.param("250us", 0.00025, id="us"),
        pytest.param("250µs", 0.00025, id="micro-sign"),
        pytest.param("0s", None, id="zero"),
        pytest.param("0", None, id="bare-zero"),
        pytest.param("-1s", None, id="negative"),
        pytest.param("5", None, id="no-unit"),
        pytest.param("soon", None, id="text"),
        pytest.param("1d", None, id="days-are-no-go-unit"),
        pytest.param("9" * 400 + "h", None, id="absurd"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_parse_go_duration(text: str | None, seconds: float | None) -> None:
    """x-llm-d-inference-ttl is read as Go's time.ParseDuration reads it; zero or worse: none."""
    parsed = parse_go_duration(text)
    assert parsed == pytest.approx(seconds) if seconds is not None else parsed is None


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        pytest.param(Claims(ttft_slo_ms=500), 0.5, id="ttft"),
        pytest.param(Claims(ttl_s=2.0), 2.0, id="ttl"),
        pytest.param(Claims(ttft_slo_ms=500, ttl_s=0.2), 0.2, id="ttl-shorter"),
        pytest.param(Claims(ttft_slo_ms=100, ttl_s=2.0), 0.1, id="ttft-shorter"),
        pytest.param(Claims(tpot_slo_ms=10), None, id="tpot-is-no-wait"),
        pytest.param(NO_CLAIMS, None, id="none"),
    ],
)
def test_the_queue_wait_cap(claims: Claims, expected: float | None) -> None:
    """The longest wait is the shorter of the TTL and the TTFT target."""
    assert claims.max_wait_s == expected


CLAIMING = {"x-tenant-id": "gold", "x-priority": "chat", "x-llm-d-inference-ttl": "1s"}


@pytest.mark.parametrize(
    ("setting", "peer", "trusted"),
    [
        pytest.param(None, "10.0.0.7", False, id="unset-trusts-nobody"),
        pytest.param("none", "127.0.0.1", False, id="none"),
        pytest.param("any", "203.0.113.9", True, id="any"),
        pytest.param("10.0.0.0/8", "10.1.2.3", True, id="in-network"),
        pytest.param("10.0.0.0/8", "192.168.1.1", False, id="outside"),
        pytest.param("10.0.0.0/8, fd00::/8", "fd00::1", True, id="ipv6"),
        pytest.param("10.0.0.0/8", "::ffff:10.0.0.9", True, id="ipv4-mapped"),
        pytest.param("fe80::/10", "fe80::1%eth0", True, id="zone"),
        pytest.param("10.0.0.5", "10.0.0.5", True, id="bare-address"),
        pytest.param("10.0.0.0/8", None, False, id="no-peer"),
        pytest.param("10.0.0.0/8", "/tmp/sock", False, id="unix-socket"),
    ],
)
def test_claims_only_from_a_trusted_peer(
    setting: str | None, peer: str | None, trusted: bool
) -> None:
    """A peer outside SIDECAR_CLAIMS_FROM claims nothing, whatever its headers say."""
    claims = parse_claim_trust(setting).claims(CLAIMING, peer, ClaimNames())
    assert claims == (read_claims(CLAIMING) if trusted else NO_CLAIMS)


@pytest.mark.parametrize("text", ["10.0.0.0/33", "gateway", "10.0.0.0/8,,nope"])
def test_a_bad_claims_from_names_the_entry(text: str) -> None:
    """A malformed SIDECAR_CLAIMS_FROM entry is refused, naming itself."""
    with pytest.raises(ValueError, match="is not a network"):
        parse_claim_trust(text)
