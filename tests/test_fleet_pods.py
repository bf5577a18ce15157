"""The fleet bench's pods: each sidecar is told what its engine was started with."""

from __future__ import annotations

import pytest

from benchmarks.fleet.pods import engine_settings, pod_flags


@pytest.mark.parametrize("seqs", [pytest.param(8, id="default"), pytest.param(3, id="three")])
def test_a_pods_sidecar_is_told_its_engines_max_num_seqs(seqs: int) -> None:
    """A pod's sidecar gets SIDECAR_ENGINE_MAX_NUM_SEQS equal to its engine's --max-num-seqs."""
    assert engine_settings(pod_flags(4.0, seqs)) == {"engine_max_num_seqs": str(seqs)}
