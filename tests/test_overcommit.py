"""The over-commit controller: hold a busy engine near its KV target, cut at once on preemption,
grow back by small steps only while the limit binds, and always stay in bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.laws.overcommit import AimdConfig, Overcommit, OvercommitEvidence

CALM = OvercommitEvidence(preemptions_total=0.0, kv_usage_ratio=0.5, requests_waiting=0.0)
IDLE = OvercommitEvidence(
    preemptions_total=0.0, kv_usage_ratio=0.1, requests_waiting=0.0, binding=False
)


def test_calm_binding_ticks_add_back_slowly() -> None:
    """Each calm tick the limit binds adds ``increase``, up to ``high``."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.25, high=1.5))
    assert [aimd.observe(CALM) for _ in range(3)] == [1.25, 1.5, 1.5]


def test_a_limit_nobody_presses_holds() -> None:
    """No request waited or was refused: nothing to grow for, however empty the engine."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.25))
    assert [aimd.observe(IDLE) for _ in range(3)] == [1.0, 1.0, 1.0]


def test_a_busy_healthy_engine_is_not_pressure() -> None:
    """KV near the target with one request briefly waiting at the engine: no cut."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.1, target=0.9))
    assert aimd.observe(
        OvercommitEvidence(preemptions_total=0.0, kv_usage_ratio=0.88, requests_waiting=1.0)
    ) == pytest.approx(1.0)
    assert aimd.last_pressure is None


def test_preemption_cuts_and_the_ratio_holds_for_patience_ticks() -> None:
    """A new preemption multiplies by ``decrease``; growth resumes only after ``patience`` calm
    ticks."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.1, decrease=0.5, patience=2))
    aimd.observe(CALM)  # 1.1, and the preemption baseline is 0
    assert aimd.observe(
        OvercommitEvidence(preemptions_total=3.0, kv_usage_ratio=0.5, requests_waiting=0.0)
    ) == pytest.approx(0.55)
    assert aimd.last_pressure == "preempted"
    later = OvercommitEvidence(preemptions_total=3.0, kv_usage_ratio=0.5, requests_waiting=0.0)
    assert [round(aimd.observe(later), 2) for _ in range(3)] == [0.55, 0.65, 0.75]


def test_kv_above_target_shrinks_in_proportion() -> None:
    """Smoothed KV usage 0.1 over the target at gain 0.5 takes 5 % off."""
    aimd = Overcommit(AimdConfig(start=1.0, target=0.8, gain=0.5, smoothing=1.0))
    assert aimd.observe(
        OvercommitEvidence(preemptions_total=0.0, kv_usage_ratio=0.9, requests_waiting=0.0)
    ) == pytest.approx(0.95)
    assert aimd.last_pressure == "kv_high"


def test_kv_usage_is_smoothed() -> None:
    """One reading above the target after calm ones is averaged down: no cut."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.0, target=0.9, smoothing=0.3))
    for _ in range(5):
        aimd.observe(CALM)
    aimd.observe(
        OvercommitEvidence(preemptions_total=0.0, kv_usage_ratio=1.0, requests_waiting=0.0)
    )
    assert aimd.usage == pytest.approx(0.5 + 0.3 * 0.5)
    assert aimd.last_pressure is None


def test_engine_queue_for_patience_ticks_is_pressure() -> None:
    """Requests waiting at the engine tick after tick (not once) shrink the ratio."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.0, decrease=0.8, patience=3))
    waiting = OvercommitEvidence(preemptions_total=0.0, kv_usage_ratio=0.5, requests_waiting=2.0)
    ratios = [aimd.observe(waiting) for _ in range(3)]
    assert ratios[:2] == [1.0, 1.0]
    assert ratios[2] == pytest.approx(0.9)
    assert aimd.last_pressure == "engine_waiting"


def test_first_preemption_count_is_only_a_baseline() -> None:
    """A counter already at 40 when the sidecar starts is history, not pressure."""
    aimd = Overcommit(AimdConfig(start=1.0, increase=0.1, patience=1))
    assert aimd.observe(
        OvercommitEvidence(preemptions_total=40.0, kv_usage_ratio=0.1, requests_waiting=0.0)
    ) == pytest.approx(1.1)


evidence = st.builds(
    OvercommitEvidence,
    preemptions_total=st.one_of(st.none(), st.floats(0, 1e6)),
    kv_usage_ratio=st.one_of(st.none(), st.floats(0, 1)),
    requests_waiting=st.one_of(st.none(), st.floats(0, 100)),
    binding=st.booleans(),
)


@given(ticks=st.lists(evidence, max_size=60), low=st.floats(0.1, 1.0), span=st.floats(0, 3))
def test_ratio_stays_in_bounds(ticks: list[OvercommitEvidence], low: float, span: float) -> None:
    """Whatever the engine says, the ratio never leaves [low, high]."""
    config = AimdConfig(low=low, start=low, high=low + span)
    aimd = Overcommit(config)
    for tick in ticks:
        ratio = aimd.observe(tick)
        assert config.low <= ratio <= config.high


@given(calm_ticks=st.integers(1, 30), preemptions=st.floats(1, 100))
def test_preemption_never_raises_the_ratio(calm_ticks: int, preemptions: float) -> None:
    """After any number of calm ticks (the first sets the baseline), a preempting tick cuts by
    ``decrease`` (or to low)."""
    aimd = Overcommit()
    for _ in range(calm_ticks):
        aimd.observe(CALM)
    before = aimd.ratio
    after = aimd.observe(
        OvercommitEvidence(preemptions_total=preemptions, kv_usage_ratio=0.5, requests_waiting=0.0)
    )
    assert after == max(aimd.config.low, before * aimd.config.decrease)
