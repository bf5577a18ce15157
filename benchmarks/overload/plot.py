"""The picture of an overload run: per load, the engine's KV usage over the first repetition,
and each configuration's SLO goodput beside its raw throughput (medians).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.overload.targets import Report


def write_plot(report: Report, path: Path) -> None:
    """Per load: the engine's KV usage over the first repetition, and each configuration's
    SLO goodput beside its raw throughput (medians)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = report.loads
    figure, axes = plt.subplots(2, len(loads), figsize=(3.8 * len(loads), 6.5), squeeze=False)
    for column, load in enumerate(loads):
        top, bottom = axes[0][column], axes[1][column]
        configs = report.configs(load)
        for index, config in enumerate(configs):
            run = next(r for r in report.runs if (r["load"], r["config"]) == (load, config))
            samples = run["engine_samples"]
            top.plot(
                [s[0] for s in samples],
                [s[1] for s in samples],
                f"C{index}",
                label=report.label(load, config),
                linewidth=1,
            )
        top.set_title(load)
        top.set_ylim(0, 1.05)
        top.set_xlabel("s into the measurement")
        top.set_ylabel("engine KV usage")
        top.legend(fontsize=6, loc="lower right")
        medians = [report.median(load, c) for c in configs]
        xs = range(len(configs))
        bottom.bar([x - 0.2 for x in xs], [m.raw for m in medians], 0.4, color="0.75", label="raw")
        bottom.bar(
            [x + 0.2 for x in xs],
            [m.slo_goodput for m in medians],
            0.4,
            color=[f"C{i}" for i in xs],
            label="SLO goodput",
        )
        bottom.set_xticks(list(xs), configs, fontsize=8)
        bottom.set_ylabel("completion tokens/s")
        bottom.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
