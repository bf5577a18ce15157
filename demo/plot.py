"""The demo's picture: each engine with the sidecar and bare, side by side over time.

Two rows per engine (paged, OOM). The first is what users feel: SLO goodput each second, time to
first token, busy answers each second. The second is the engine's insides: requests at the
engine (and the sidecar's queue), its KV use, streams completed (failed, preemptions). The
sidecar's run is solid, the bare engine's dashed. matplotlib (Agg, no display) is a dependency
of the demo only: ``pip install -e '.[demo]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from demo.compare import OBJECTIVES, RunResult

Pen = tuple[str, str]  # colour, line style
OURS, BARE = "#1f77b4", "#d62728"
FELT = (
    "SLO goodput (tok/s of streams that met both objectives)",
    "TTFT of completed streams (median so far)",
    "busy answers (refusals) per second",
)
INSIDE = ("requests at the engine", "engine KV use", "streams completed")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _line(axis: Axes, xs: Sequence[float], ys: Sequence[float], pen: Pen, label: str) -> None:
    axis.plot(xs, ys, color=pen[0], ls=pen[1], label=label)


def _per_second(
    axis: Axes, result: RunResult, values: Sequence[float], pen: Pen, label: str
) -> None:
    """One value per second of the run, drawn as steps over the second each covers."""
    starts = [t for t, _ in result.timeline]
    if starts:
        end = starts[-1] + (starts[1] - starts[0] if len(starts) > 1 else 1.0)
        xs, ys = [*starts, end], [*values, values[-1]]
        axis.plot(xs, ys, color=pen[0], ls=pen[1], drawstyle="steps-post", label=label)


def _draw_felt(axes: Sequence[Axes], result: RunResult, pen: Pen) -> None:
    goodput, ttft, busy = axes
    run, share = result.label, result.busy / result.sent if result.sent else 0.0
    served = f"{result.slo_goodput:,.0f} tok/s over the run (raw {result.raw_tokens_per_s:,.0f})"
    _per_second(
        goodput, result, [f.slo_goodput for _, f in result.timeline], pen, f"{run}: {served}"
    )
    points = [(s.t_s, s.p50_ttft_s) for s in result.samples if s.p50_ttft_s is not None]
    p50, p99 = _seconds(result.p50_ttft_s), _seconds(result.p99_ttft_s)
    _line(ttft, [t for t, _ in points], [v for _, v in points], pen, f"{run}: p50 {p50}, p99 {p99}")
    refused = f"{result.busy:,} of {result.sent:,} requests ({share:.0%})"
    _per_second(busy, result, [f.busy for _, f in result.timeline], pen, f"{run}: {refused}")


def _draw_inside(axes: Sequence[Axes], result: RunResult, pen: Pen) -> None:
    running, kv, done = axes
    t, run, samples = [s.t_s for s in result.samples], result.label, result.samples
    _line(running, t, [s.engine_running for s in samples], pen, f"{run}: running at the engine")
    _line(kv, t, [100 * s.kv_usage for s in samples], pen, run)
    _line(done, t, [s.completed for s in samples], pen, f"{run}: completed")
    if any(s.failed for s in samples):
        _line(done, t, [s.failed for s in samples], (pen[0], ":"), f"{run}: failed (OOM)")
    if any(s.preemptions for s in samples):
        _line(done, t, [s.preemptions for s in samples], (pen[0], "-."), f"{run}: preemptions")


UNITS = ("tok/s", "seconds", "per second", "requests", "KV use %", "streams")


def _finish(felt: Sequence[Axes], inside: Sequence[Axes], ours: RunResult, engine: str) -> None:
    """Objective line, the sidecar's queue, labels, room for the legends."""
    felt[1].axhline(OBJECTIVES.ttft_s, color="grey", lw=1, ls=":", label="objective")
    inside[0].fill_between(
        [s.t_s for s in ours.samples],
        [s.queued for s in ours.samples],
        step="post",
        color=OURS,
        alpha=0.25,
        label="queued at the sidecar",
    )
    for axis, unit in zip((*felt, *inside), UNITS, strict=True):
        axis.set_ylabel(unit)
        # Room above the lines for the legend; KV use is a share, to 100 %.
        axis.set_ylim(0, 105 if axis is inside[1] else max(1.0, axis.get_ylim()[1]) * 1.3)
        axis.legend(loc="upper left", fontsize=7, framealpha=0.9)
        axis.grid(alpha=0.3)
    felt[0].set_ylabel(f"{engine}: what users feel\n{UNITS[0]}")
    inside[0].set_ylabel(f"{engine}: inside\n{UNITS[3]}")


def _draw_pair(
    felt: Sequence[Axes], inside: Sequence[Axes], ours: RunResult, bare: RunResult
) -> None:
    for result, pen in ((ours, (OURS, "-")), (bare, (BARE, "--"))):
        _draw_felt(felt, result, pen)
        _draw_inside(inside, result, pen)
    _finish(felt, inside, ours, ours.label.split(" + ")[0] + " engine")
    for axis, heading in zip((*felt, *inside), (*FELT, *INSIDE), strict=True):
        axis.set_title(heading, fontsize=9)


def write_comparison(results: Sequence[RunResult], path: Path, title: str) -> Path:
    """Draw (ours, bare) pairs, two rows per engine, to ``path`` (PNG); returns the path."""
    pairs = [(results[i], results[i + 1]) for i in range(0, len(results) - 1, 2)]
    fig, grid = plt.subplots(
        2 * len(pairs),
        3,
        figsize=(16, 3.6 * 2 * len(pairs)),
        squeeze=False,
        sharex=True,
        layout="constrained",
    )
    for row, (ours, bare) in enumerate(pairs):
        _draw_pair(grid[2 * row], grid[2 * row + 1], ours, bare)
    for axis in grid[-1]:
        axis.set_xlabel("seconds into the run")
        axis.set_xlim(left=0)
    fig.suptitle(title, fontsize=12)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
