"""AIMD over-commit: cut at once on the engine's evidence, grow back slowly, always in bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.overcommit import AimdConfig, EngineEvidence, Overcommit

CALM = EngineEvidence(preemptions_total=0.0, kv_usage_ratio=0.5, requests_waiting=0.0)


def test_healthy_ticks_add_back_slowly() -> None:
    """Each healthy tick adds ``increase``, up to ``high``."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.25, high=1.5))
    assert [aimd.observe(CALM) for _ in range(3)] == [1.25, 1.5, 1.5]


@pytest.mark.parametrize(
    ("evidence", "pressure"),
    [
        pytest.param(EngineEvidence(1.0, 0.5, 0.0), "preempted", id="new-preemption"),
        pytest.param(EngineEvidence(0.0, 0.97, 0.0), "kv_high", id="kv-above-watermark"),
        pytest.param(EngineEvidence(0.0, 0.5, 2.0), "engine_waiting", id="engine-queue"),
    ],
)
def test_pressure_cuts_at_once(evidence: EngineEvidence, pressure: str) -> None:
    """One tick of pressure multiplies the ratio by ``decrease`` and names the cause."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.02, decrease=0.5))
    aimd.observe(CALM)  # sets the preemption baseline to 0
    assert aimd.observe(evidence) == pytest.approx(0.51)
    assert aimd.last_pressure == pressure


def test_first_preemption_count_is_only_a_baseline() -> None:
    """A counter already at 40 when the sidecar starts is history, not pressure."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.1))
    assert aimd.observe(EngineEvidence(40.0, 0.1, 0.0)) == pytest.approx(1.1)


evidence = st.builds(
    EngineEvidence,
    st.one_of(st.none(), st.floats(0, 1e6)),
    st.one_of(st.none(), st.floats(0, 1)),
    st.one_of(st.none(), st.floats(0, 100)),
)


@given(ticks=st.lists(evidence, max_size=60), low=st.floats(0.1, 1.0), span=st.floats(0, 3))
def test_ratio_stays_in_bounds(ticks: list[EngineEvidence], low: float, span: float) -> None:
    """Whatever the engine says, the ratio never leaves [low, high]."""
    config = AimdConfig(low=low, start=low, high=low + span)
    aimd = Overcommit(config)
    for tick in ticks:
        ratio = aimd.observe(tick)
        assert config.low <= ratio <= config.high


@given(ratio_ticks=st.integers(0, 30))
def test_pressure_never_raises_the_ratio(ratio_ticks: int) -> None:
    """After any number of healthy ticks, a pressured tick lowers the ratio (or holds it at low)."""
    aimd = Overcommit()
    for _ in range(ratio_ticks):
        aimd.observe(CALM)
    before = aimd.ratio
    after = aimd.observe(EngineEvidence(0.0, 0.99, 0.0))
    assert after <= before
    assert after == max(aimd.config.low, before * aimd.config.decrease)
