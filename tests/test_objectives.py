"""A request's latency objectives: what it claims (trusted SLO headers), else the defaults."""

from __future__ import annotations

import pytest

from sidecar.core.request.claims import Claims, read_claims
from sidecar.core.request.objectives import Objectives, objectives_of

DEFAULTS = Objectives(ttft_s=2.0, tpot_s=0.1)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({}, DEFAULTS, id="none"),
        pytest.param({"x-llm-d-slo-ttft-ms": "500"}, Objectives(0.5, 0.1), id="llm-d-ttft"),
        pytest.param({"X-LLM-D-SLO-TPOT-MS": "40"}, Objectives(2.0, 0.04), id="llm-d-tpot-case"),
        pytest.param({"x-slo-ttft-ms": "750"}, Objectives(0.75, 0.1), id="older-ttft"),
        pytest.param(
            {"x-slo-ttft-ms": "750", "x-llm-d-slo-ttft-ms": "300"},
            Objectives(0.3, 0.1),
            id="llm-d-before-older",
        ),
        pytest.param({"x-llm-d-slo-ttft-ms": "-5"}, DEFAULTS, id="negative-ignored"),
        pytest.param({"x-llm-d-slo-ttft-ms": "0"}, DEFAULTS, id="zero-ignored"),
        pytest.param({"x-llm-d-slo-ttft-ms": "1.5"}, DEFAULTS, id="fraction-ignored"),
    ],
)
def test_objectives_from_claimed_headers(headers: dict[str, str], expected: Objectives) -> None:
    """Whole milliseconds > 0 set an objective; anything else leaves the default."""
    assert objectives_of(read_claims(headers), DEFAULTS) == expected


def test_no_claims_keep_the_defaults() -> None:
    """An untrusted peer claims nothing: the operator's defaults hold."""
    assert objectives_of(Claims(), Objectives(1.0, 0.05)) == Objectives(1.0, 0.05)
