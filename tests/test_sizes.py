"""Tests for sidecar.core.sizes: reading and showing memory sizes, the same for CLI and settings."""

from __future__ import annotations

import pytest

from sidecar.core.errors import ConfigError
from sidecar.core.sizes import format_size, parse_size
from sidecar.entry.cli import main
from sidecar.entry.settings import load_settings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("24GiB", 24 * 1024**3, id="gibibytes"),
        pytest.param("1024TiB", 1024**5, id="the-largest-accepted"),
        pytest.param("24GB", 24 * 10**9, id="gigabytes"),
        pytest.param("1.5GiB", 1_610_612_736, id="fractional-gib"),
        pytest.param("5.0 GiB", 5 * 1024**3, id="space-before-unit"),
        pytest.param("512MiB", 512 * 1024**2, id="mebibytes"),
        pytest.param("512MB", 512 * 10**6, id="megabytes"),
        pytest.param("8gib", 8 * 1024**3, id="lower-case-binary-unit"),
        pytest.param("1073741824", 1024**3, id="bare-bytes"),
        pytest.param("4096B", 4096, id="bytes-with-b"),
        pytest.param(" 2TiB ", 2 * 1024**4, id="surrounding-space"),
        pytest.param("64KiB", 64 * 1024, id="kibibytes"),
        pytest.param("64KB", 64_000, id="kilobytes"),
        pytest.param("24Gi", 24 * 1024**3, id="k8s-gi"),
        pytest.param("512Mi", 512 * 1024**2, id="k8s-mi"),
        pytest.param("2Ti", 2 * 1024**4, id="k8s-ti"),
        pytest.param("64Ki", 64 * 1024, id="k8s-ki"),
        pytest.param("24G", 24 * 10**9, id="k8s-decimal-g"),
        pytest.param("500M", 500 * 10**6, id="k8s-decimal-m"),
        pytest.param("64k", 64_000, id="k8s-decimal-lower-k"),
        pytest.param("1T", 10**12, id="k8s-decimal-t"),
        pytest.param("1.3Gi", 1_395_864_371, id="fraction-of-a-byte-rounds-down"),
        pytest.param(".5GiB", 512 * 1024**2, id="leading-point"),
        pytest.param("0", 0, id="zero"),
    ],
)
def test_parse_size_reads_units(text: str, expected: int) -> None:
    """Binary, decimal and Kubernetes units and bare byte counts all come out as exact bytes."""
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param("", "expected a number", id="empty"),
        pytest.param("lots", "expected a number", id="words"),
        pytest.param("-5GiB", "a size cannot be negative", id="negative"),
        pytest.param("-lots", "expected a number", id="dash-words"),
        pytest.param("12 parsecs", "unknown unit 'parsecs'", id="unknown-unit"),
        pytest.param("1e9", "expected a number", id="exponent"),
        pytest.param("24 GiB GiB", "expected a number", id="two-units"),
        pytest.param("24g", "'g' is ambiguous; write 24GiB (or 24Gi)", id="lower-g"),
        pytest.param("24gb", "'gb' is ambiguous; write 24GiB (or 24Gi)", id="lower-gb"),
        pytest.param("24Gb", "'Gb' is ambiguous; write 24GiB", id="mixed-case-gb"),
        pytest.param("512m", "'m' is ambiguous; write 512MiB (or 512Mi)", id="k8s-milli"),
        pytest.param("64K", "'K' is ambiguous; write 64KiB (or 64Ki)", id="upper-k"),
        pytest.param("1025TiB", "more than 1 PiB", id="implausibly-large"),
    ],
)
def test_parse_size_names_bad_text(text: str, why: str) -> None:
    """Unreadable or ambiguous sizes raise ConfigError quoting the text and saying what to write."""
    with pytest.raises(ConfigError) as raised:
        parse_size(text)
    assert str(raised.value).startswith(f"cannot read size {text!r}: ")
    assert why in str(raised.value)


def test_ambiguous_size_suggests_both_readings() -> None:
    """'24g' is refused with both spellings that say what the user meant."""
    with pytest.raises(ConfigError) as raised:
        parse_size("24g")
    assert "write 24GiB (or 24Gi) for powers of 1024, or 24GB for powers of 1000" in str(
        raised.value
    )


@pytest.mark.parametrize(
    ("flag", "setting"),
    [
        pytest.param("--vram", "SIDECAR_VRAM_TOTAL", id="vram"),
        pytest.param("--weights", "SIDECAR_WEIGHTS", id="weights"),
        pytest.param("--overhead", "SIDECAR_OVERHEAD", id="overhead"),
    ],
)
def test_cli_and_settings_refuse_a_size_with_the_same_words(
    flag: str, setting: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sidecar plan --vram 24g` and SIDECAR_VRAM_TOTAL=24g give the same reason, each named."""
    memory = {"--vram": "24GiB", "--weights": "5GiB", "--overhead": "1GiB"} | {flag: "24g"}
    argv = ["plan", "--model", "qwen2.5-7b"] + [part for pair in memory.items() for part in pair]
    assert main(argv) == 2
    cli_error = capsys.readouterr().err
    with pytest.raises(ConfigError) as raised:
        load_settings({setting: "24g"})
    reason = "cannot read size '24g': 'g' is ambiguous"
    assert f"{flag}: {reason}" in cli_error
    assert f"invalid setting {setting} (got '24g'): {reason}" in str(raised.value)


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--vram", "-5GiB"], id="separate"),
        pytest.param(["--vram=-5GiB"], id="joined"),
    ],
)
def test_a_negative_size_flag_is_named_however_it_is_written(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse would read "-5GiB" as an option and say only "expected one argument"."""
    assert main(["plan", "--model", "qwen2.5-7b", *argv, "--weights", "15GiB"]) == 2
    assert "--vram: cannot read size '-5GiB': a size cannot be negative" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("setting", "text", "expected"),
    [
        pytest.param("SIDECAR_VRAM_TOTAL", "24Gi", 24 * 1024**3, id="vram-k8s"),
        pytest.param("SIDECAR_KV_POOL", "1.5GiB", 1_610_612_736, id="kv-pool-fraction"),
        pytest.param("SIDECAR_OVERHEAD", "1500M", 1_500_000_000, id="overhead-decimal"),
        pytest.param("SIDECAR_MAX_BODY_BYTES", "8Mi", 8 * 1024**2, id="body-k8s"),
        pytest.param("SIDECAR_WEIGHTS", "15231233024", 15_231_233_024, id="weights-bytes"),
    ],
)
def test_settings_read_sizes_with_the_cli_parser(setting: str, text: str, expected: int) -> None:
    """Every size setting takes the same spellings as the CLI, Kubernetes quantities included."""
    settings = load_settings({setting: text})
    assert getattr(settings, setting.removeprefix("SIDECAR_").lower()) == expected


def test_weights_auto_is_still_a_word() -> None:
    """SIDECAR_WEIGHTS=auto asks for measured weights; it is not read as a size."""
    assert load_settings({"SIDECAR_WEIGHTS": "Auto"}).weights == "auto"


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
