"""Settings errors read as one line a user can act on, whichever check failed."""

from __future__ import annotations

import pytest

from sidecar.core.errors import ConfigError
from sidecar.entry.settings import load_settings


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {"SIDECAR_CAPACITY_SOURCE": "static"},
            "invalid settings: SIDECAR_CAPACITY_SOURCE=static needs SIDECAR_KV_POOL or "
            "SIDECAR_VRAM_TOTAL",
            id="static-without-numbers",
        ),
        pytest.param(
            {"SIDECAR_PORT": "9191", "SIDECAR_ADMIN_PORT": "9191"},
            "invalid settings: SIDECAR_PORT and SIDECAR_ADMIN_PORT are both 9191; they must differ",
            id="port-clash",
        ),
        pytest.param(
            {"SIDECAR_MAX_QUEUE": "abc"},
            "invalid setting SIDECAR_MAX_QUEUE (got 'abc'): Input should be a valid integer, "
            "unable to parse string as an integer",
            id="one-field",
        ),
        pytest.param(
            {"SIDECAR_SAFETY_FACTOR": "nan"},
            "invalid setting SIDECAR_SAFETY_FACTOR (got 'nan'): Input should be a finite number",
            id="nan-factor",
        ),
        pytest.param(
            {"SIDECAR_DRAIN_GRACE_S": "inf"},
            "invalid setting SIDECAR_DRAIN_GRACE_S (got 'inf'): Input should be a finite number",
            id="infinite-grace",
        ),
        pytest.param(
            {"SIDECAR_COMPARTMENTS": "gold=70%,silver=40%"},
            "invalid setting SIDECAR_COMPARTMENTS (got 'gold=70%,silver=40%'): compartment "
            "shares add up to 110%, more than 100%: 'gold=70%,silver=40%'",
            id="compartments-over-100",
        ),
        pytest.param(
            {"SIDECAR_TOKENIZE_TIMEOUT_MS": "0"},
            "invalid setting SIDECAR_TOKENIZE_TIMEOUT_MS (got '0'): Input should be greater than 0",
            id="tokenize-timeout-zero",
        ),
        pytest.param(
            {"SIDECAR_TOKENIZE_PER_CLIENT": "-1"},
            "invalid setting SIDECAR_TOKENIZE_PER_CLIENT (got '-1'): Input should be greater "
            "than 0",
            id="tokenize-share-negative",
        ),
        pytest.param(
            {"SIDECAR_OVERLOAD_STOP_ACCEPTING": "0.9", "SIDECAR_OVERLOAD_SHED": "0.8"},
            "invalid settings: SIDECAR_OVERLOAD_SHED (0.8) is below "
            "SIDECAR_OVERLOAD_STOP_ACCEPTING (0.9); connections are shed only past where new "
            "ones are refused",
            id="shed-below-stop",
        ),
        pytest.param(
            {"SIDECAR_OVERLOAD_SHED": "1.5"},
            "invalid setting SIDECAR_OVERLOAD_SHED (got '1.5'): Input should be less than or "
            "equal to 1",
            id="shed-past-all-memory",
        ),
        pytest.param(
            {"SIDECAR_ENGINE_MAX_NUM_SEQS": "0"},
            "invalid setting SIDECAR_ENGINE_MAX_NUM_SEQS (got '0'): Input should be greater than 0",
            id="max-num-seqs-zero",
        ),
        pytest.param(
            {"SIDECAR_ENGINE_MAX_NUM_SEQS": "eight"},
            "invalid setting SIDECAR_ENGINE_MAX_NUM_SEQS (got 'eight'): Input should be a valid "
            "integer, unable to parse string as an integer",
            id="max-num-seqs-not-a-number",
        ),
    ],
)
def test_each_error_is_worded_for_what_failed(environ: dict[str, str], expected: str) -> None:
    """A check across settings is not reported as a setting called 'settings'."""
    with pytest.raises(ConfigError) as raised:
        load_settings(environ)
    assert str(raised.value) == expected
