"""Compartment specs: parsing, the implied default, and share arithmetic."""

from __future__ import annotations

import pytest

from sidecar.core.admission.compartments import Compartments, CompartmentSpec, parse_compartments
from sidecar.core.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(None, [("default", 1.0, 1.0)], id="unset-one-for-all"),
        pytest.param("  ", [("default", 1.0, 1.0)], id="blank-one-for-all"),
        pytest.param(
            "gold=50%,silver=0.3",
            [("gold", 0.5, 1.0), ("silver", 0.3, 1.0), ("default", 0.2, 1.0)],
            id="default-gets-the-rest",
        ),
        pytest.param(
            "gold=20%:50%, default=10%",
            [("gold", 0.2, 0.5), ("default", 0.1, 1.0)],
            id="cap-and-explicit-default",
        ),
        pytest.param("high=1.0", [("high", 1.0, 1.0), ("default", 0.0, 1.0)], id="all-to-one"),
    ],
)
def test_parse(text: str | None, expected: list[tuple[str, float, float]]) -> None:
    """A spec becomes named shares and caps; whatever is unclaimed goes to default."""
    parsed = parse_compartments(text)
    assert [(s.name, float(s.share), float(s.cap)) for s in parsed.specs] == expected


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        pytest.param("gold=70%,silver=40%", "more than 100%", id="over-100"),
        pytest.param("gold", "expected name=share", id="no-share"),
        pytest.param("gold=lots", "not a fraction", id="not-a-number"),
        pytest.param("gold=150%", "outside 0..1", id="over-one"),
        pytest.param("gold=-0.1", "outside 0..1", id="negative"),
        pytest.param("gold=nan", "not a fraction", id="nan"),
        pytest.param("gold=50%:20%", "below share", id="cap-below-share"),
        pytest.param("gold=10%,gold=20%", "named twice", id="duplicate"),
        pytest.param("a b=10%", "expected name=share", id="bad-name"),
    ],
)
def test_parse_rejects_bad_specs(text: str, complaint: str) -> None:
    """A bad spec is a ConfigError that names what is wrong."""
    with pytest.raises(ConfigError, match=complaint):
        parse_compartments(text)


def test_compartments_must_hold_default() -> None:
    """A hand-built set without default is refused: unknown tenants need somewhere to go."""
    with pytest.raises(ConfigError, match="default"):
        Compartments((CompartmentSpec("gold", 0.5),))


@pytest.mark.parametrize(
    ("limit", "share", "cap", "guaranteed", "ceiling"),
    [
        pytest.param(10, 0.5, 1.0, 5, 10, id="half-of-ten"),
        pytest.param(5, 0.3, 0.5, 1, 2, id="rounds-down"),
        pytest.param(0, 0.5, 1.0, 0, 0, id="limit-zero"),
        pytest.param(1_610_612_736, 0.25, 1.0, 402_653_184, 1_610_612_736, id="bytes"),
    ],
)
def test_share_arithmetic(
    limit: int, share: float, cap: float, guaranteed: int, ceiling: int
) -> None:
    """Guarantees and ceilings are whole units of the limit, rounded down."""
    spec = CompartmentSpec("x", share, cap)
    assert (spec.guaranteed(limit), spec.ceiling(limit)) == (guaranteed, ceiling)


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        pytest.param("a=29%", 100, {"a": 29, "default": 71}, id="29-percent-of-100"),
        pytest.param("a=50%,b=0.3", 10, {"a": 5, "b": 3, "default": 2}, id="remainder-exact"),
        pytest.param("a=0.1,b=0.2", 30, {"a": 3, "b": 6, "default": 21}, id="tenths"),
    ],
)
def test_shares_are_exact(text: str, limit: int, expected: dict[str, int]) -> None:
    """Shares are exact fractions: no permit is lost to floating-point rounding."""
    parsed = parse_compartments(text)
    assert {s.name: s.guaranteed(limit) for s in parsed.specs} == expected


def test_resolve_sends_unknown_keys_to_default() -> None:
    """Named keys keep their compartment; any other key lands in default."""
    parsed = parse_compartments("gold=50%")
    assert [parsed.resolve(k) for k in ("gold", "key-0123456789ab", "")] == [
        "gold",
        "default",
        "default",
    ]
