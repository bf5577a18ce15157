"""The demo's picture: each engine with the sidecar and bare, side by side over time.

One row per engine (paged, OOM); columns: requests at the engine, its KV use, streams completed
(failed, preemptions), time to first token. The sidecar's run is solid, the bare engine's dashed.
matplotlib (Agg, no display) is a dependency of the demo only: ``pip install -e '.[demo]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from demo.compare import RunResult

OURS, BARE = "#1f77b4", "#d62728"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _draw_ttft(axis: Axes, result: RunResult, colour: str, style: str) -> None:
    points = [(s.t_s, s.p50_ttft_s) for s in result.samples if s.p50_ttft_s is not None]
    label = f"{result.label}: p50 {_seconds(result.p50_ttft_s)}, p99 {_seconds(result.p99_ttft_s)}"
    axis.plot([t for t, _ in points], [v for _, v in points], color=colour, ls=style, label=label)


def _draw_row(axes: Sequence[Axes], ours: RunResult, bare: RunResult, engine: str) -> None:
    running, kv, done, ttft = axes
    for result, colour, style in ((ours, OURS, "-"), (bare, BARE, "--")):
        _draw_ttft(ttft, result, colour, style)
        t = [s.t_s for s in result.samples]
        running.plot(t, [s.engine_running for s in result.samples], color=colour, ls=style,
                     label=f"{result.label}: running at the engine")  # fmt: skip
        kv.plot(t, [100 * s.kv_usage for s in result.samples], color=colour, ls=style,
                label=result.label)  # fmt: skip
        done.plot(t, [s.completed for s in result.samples], color=colour, ls=style,
                  label=f"{result.label}: completed")  # fmt: skip
        if any(s.failed for s in result.samples):
            done.plot(t, [s.failed for s in result.samples], color=colour, ls=":",
                      label=f"{result.label}: failed (OOM)")  # fmt: skip
        if any(s.preemptions for s in result.samples):
            done.plot(t, [s.preemptions for s in result.samples], color=colour, ls="-.",
                      label=f"{result.label}: preemptions")  # fmt: skip
    t_ours = [s.t_s for s in ours.samples]
    running.fill_between(t_ours, [s.queued for s in ours.samples], step="post", color=OURS,
                         alpha=0.25, label="queued at the sidecar")  # fmt: skip
    running.set_ylabel(f"{engine}\nrequests")
    kv.set_ylabel("KV use %")
    kv.set_ylim(0, 105)
    done.set_ylabel("streams")
    ttft.set_ylabel("seconds")
    ttft.set_ylim(0, ttft.get_ylim()[1] * 1.25)  # room above the lines for the legend
    for axis in axes:
        axis.legend(loc="upper left", fontsize=7, framealpha=0.9)
        axis.grid(alpha=0.3)


def write_comparison(results: Sequence[RunResult], path: Path, title: str) -> Path:
    """Draw (ours, bare) pairs, one row per engine, to ``path`` (PNG); returns the path."""
    pairs = [(results[i], results[i + 1]) for i in range(0, len(results) - 1, 2)]
    fig, grid = plt.subplots(
        len(pairs), 4, figsize=(19, 4.4 * len(pairs)), squeeze=False, sharex=True,
        layout="constrained",
    )  # fmt: skip
    for row, (ours, bare) in enumerate(pairs):
        _draw_row(grid[row], ours, bare, ours.label.split(" + ")[0] + " engine")
    headings = ("requests at the engine", "engine KV use", "streams completed",
                "TTFT of completed streams (median so far)")  # fmt: skip
    for axis, heading in zip(grid[0], headings, strict=True):
        axis.set_title(heading, fontsize=10)
    for axis in grid[-1]:
        axis.set_xlabel("seconds into the run")
        axis.set_xlim(left=0)
    fig.suptitle(title, fontsize=12)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
