"""The demo's picture: a PNG timeline of permits, in use, queued, engine running and KV use.

matplotlib (Agg, no display) is a dependency of the demo only: ``pip install -e '.[demo]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from demo.dashboard import Sample

SHADES = ("#e8f1fb", "#fdecea", "#fff4e0", "#eaf7ec")


def phase_spans(samples: Sequence[Sample]) -> list[tuple[str, float, float]]:
    """(phase, first t, last t) for each phase, in the order the samples show them."""
    spans: list[tuple[str, float, float]] = []
    for sample in samples:
        if spans and spans[-1][0] == sample.phase:
            spans[-1] = (sample.phase, spans[-1][1], sample.t_s)
        else:
            start = spans[-1][2] if spans else sample.t_s
            spans.append((sample.phase, start, sample.t_s))
    return spans


def write_timeline(samples: Sequence[Sample], path: Path, title: str) -> Path:
    """Draw the run to ``path`` (PNG); returns the path."""
    t = [s.t_s for s in samples]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 6.5), sharex=True, height_ratios=(3, 1.3), layout="constrained"
    )
    for axis in (top, bottom):
        for i, (name, start, end) in enumerate(phase_spans(samples)):
            axis.axvspan(start, end, color=SHADES[i % len(SHADES)], zorder=0)
            if axis is top:
                axis.text((start + end) / 2, 1.01, name, transform=axis.get_xaxis_transform(),
                          ha="center", va="bottom", fontsize=9)  # fmt: skip
    top.step(t, [s.permits for s in samples], where="post", color="black", lw=2, label="permits")
    top.plot(t, [s.in_use for s in samples], color="#1f77b4", label="in use (admitted)")
    top.plot(t, [s.engine_running for s in samples], color="#2ca02c", ls="--",
             label="engine running")  # fmt: skip
    top.fill_between(t, [s.queued for s in samples], step="post", color="#ff7f0e", alpha=0.5,
                     label="queued at the sidecar")  # fmt: skip
    top.set_ylabel("requests")
    top.legend(loc="upper right", fontsize=8, framealpha=0.9)
    top.set_title(title, fontsize=11, pad=18)
    bottom.plot(t, [100 * s.kv_usage for s in samples], color="#9467bd", label="engine KV use")
    bottom.set_ylim(0, 100)
    bottom.set_ylabel("KV use %")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper right", fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
