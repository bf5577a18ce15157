"""Tests for sidecar.core.sizes: reading and showing memory sizes."""

from __future__ import annotations

import pytest

from sidecar.core.errors import ConfigError
from sidecar.core.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("24GiB", 24 * 1024**3, id="gibibytes"),
        pytest.param("24GB", 24 * 10**9, id="gigabytes"),
        pytest.param("1.5GiB", 1_610_612_736, id="fractional-gib"),
        pytest.param("5.0 GiB", 5 * 1024**3, id="space-before-unit"),
        pytest.param("512MiB", 512 * 1024**2, id="mebibytes"),
        pytest.param("512MB", 512 * 10**6, id="megabytes"),
        pytest.param("8gib", 8 * 1024**3, id="lower-case-unit"),
        pytest.param("1073741824", 1024**3, id="bare-bytes"),
        pytest.param(" 2TiB ", 2 * 1024**4, id="surrounding-space"),
    ],
)
def test_parse_size_reads_units(text: str, expected: int) -> None:
    """Binary and decimal units and bare byte counts all come out as exact bytes."""
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("lots", id="words"),
        pytest.param("-5GiB", id="negative"),
        pytest.param("12 parsecs", id="unknown-unit"),
        pytest.param("1e9", id="exponent"),
    ],
)
def test_parse_size_names_bad_text(text: str) -> None:
    """Unreadable sizes raise ConfigError quoting what the user typed."""
    with pytest.raises(ConfigError, match=f"cannot read size {text!r}"):
        parse_size(text)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        pytest.param(1_610_612_736, "1.50 GiB (1,610,612,736 B)", id="gib"),
        pytest.param(57_344, "56.00 KiB (57,344 B)", id="kib"),
        pytest.param(229_376_000, "218.75 MiB (229,376,000 B)", id="mib"),
        pytest.param(512, "512 B", id="bytes"),
        pytest.param(0, "0 B", id="zero"),
    ],
)
def test_format_size_shows_unit_and_exact_bytes(n: int, expected: str) -> None:
    """Sizes show a readable binary unit and the exact byte count."""
    assert format_size(n) == expected
