"""A fleet run's figures, from its records: what users felt, what the fleet cost, how the
autoscaler moved; the markdown table and the picture over time."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from demo.slo import quantile

BIN_S = 60.0  # cluster seconds per point of the attainment curve


def _replica_seconds(pods: Sequence[dict[str, Any]], end: float) -> float:
    """Cluster seconds of every pod from creation to gone (a GPU is held while it loads and
    while it drains), inside the trace."""
    total = 0.0
    for pod in pods:
        gone = end if pod["gone_at"] is None else min(end, pod["gone_at"])
        total += max(0.0, gone - max(0.0, pod["created"]))
    return total


def _direction_changes(ticks: Sequence[dict[str, Any]]) -> int:
    signs = [
        1 if t["desired"] > t["replicas"] else -1 for t in ticks if t["desired"] != t["replicas"]
    ]
    return sum(1 for a, b in itertools.pairwise(signs) if a != b)


def summarise(run: dict[str, Any]) -> dict[str, float]:
    """The figures of one run (times in cluster seconds, goodput per real second)."""
    requests, ticks, pods = run["requests"], run["ticks"], run["pods"]
    step_begin, step_end, end = run["step"][0], run["step"][1], run["end"]
    within = [r for r in requests if r["within"]]
    ups = [t["at"] for t in ticks if t["at"] >= step_begin and t["desired"] > t["replicas"]]
    decided = ups[0] if ups else math.nan
    new_ready = [p["ready_at"] for p in pods if p["created"] >= step_begin and p["ready_at"]]
    in_step = [r["ttft_s"] for r in requests if step_begin <= r["began"] < step_end and r["served"]]
    return {
        "offered": len(requests),
        "attainment": len(within) / len(requests) if requests else math.nan,
        "slo_goodput": sum(r["tokens"] for r in within) / (end / run["scale"]),
        "replica_s": _replica_seconds(pods, end),
        "to_decision_s": decided - step_begin,
        "to_ready_s": min(new_ready, default=math.nan) - step_begin,
        "direction_changes": _direction_changes(ticks),
        "ttft_p99_step_s": quantile(in_step, 0.99),
        "refusals": sum(r["busy"] for r in requests),
        "unserved": sum(1 for r in requests if not r["served"]),
        # a request that ended on an error, not a busy answer (none expected)
        "errors": sum(1 for r in requests if not r["served"] and r["busy"] < r["attempts"]),
        "max_replicas": max((t["replicas"] for t in ticks), default=0),
    }


def medians(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    keys = runs[0]["summary"].keys()
    return {k: statistics.median(r["summary"][k] for r in runs) for k in keys}


def table(case: str, rows: dict[str, dict[str, float]], labels: dict[str, str]) -> list[str]:
    """The markdown table of one case: one row per configuration (medians)."""
    static = rows.get("d", {}).get("replica_s", math.nan)
    lines = [
        f"\n**{case}**\n",
        "| config | attainment | SLO goodput tok/s | replica-s (x static) | step to decision s "
        "| step to new pod ready s | direction changes | TTFT p99 in step s | refusals "
        "| errors | max pods |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in rows.items():
        lines.append(
            f"| {labels[name]} | {m['attainment']:.1%} | {m['slo_goodput']:,.0f} | "
            f"{m['replica_s']:,.0f} ({m['replica_s'] / static:.2f}x) | {m['to_decision_s']:.0f} | "
            f"{m['to_ready_s']:.0f} | {m['direction_changes']:.0f} | {m['ttft_p99_step_s']:.2f} | "
            f"{m['refusals']:.0f} | {m['errors']:.0f} | {m['max_replicas']:.0f} |"
        )
    return lines


def _attainment_curve(run: dict[str, Any]) -> tuple[list[float], list[float]]:
    bins: dict[int, list[bool]] = {}
    for r in run["requests"]:
        bins.setdefault(int(r["began"] // BIN_S), []).append(r["within"])
    xs = sorted(bins)
    return [(x + 0.5) * BIN_S for x in xs], [sum(bins[x]) / len(bins[x]) for x in xs]


def write_plot(runs: Sequence[dict[str, Any]], cases: Sequence[str], path: Path) -> None:
    """One row per configuration, one column per case: the load (shares of one pod), the
    replicas (created and serving) and the attainment of the requests begun in each minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in runs))
    size = (4.5 * len(cases), 2.2 * len(configs))
    figure, axes = plt.subplots(len(configs), len(cases), figsize=size, squeeze=False)
    for row, config in enumerate(configs):
        for column, case in enumerate(cases):
            axis = axes[row][column]
            run = next((r for r in runs if (r["config"], r["case"]) == (config, case)), None)
            if run is None:
                continue
            ticks = run["ticks"]
            at = [t["at"] for t in ticks]
            axis.plot(at, [t["share"] for t in ticks], "0.6", label="load (pods)")
            axis.step(at, [t["replicas"] for t in ticks], "C0", where="post", label="replicas")
            axis.step(at, [t["serving"] for t in ticks], "C0:", where="post", label="serving")
            axis.set_ylim(0, run["max_replicas"] + 0.5)
            twin = axis.twinx()
            xs, ys = _attainment_curve(run)
            twin.plot(xs, ys, "C3.-", label="attainment")
            twin.set_ylim(0, 1.05)
            axis.set_title(f"{run['label']} / {case}", fontsize=8)
            if row == len(configs) - 1:
                axis.set_xlabel("cluster s")
            if row == 0 and column == 0:
                axis.legend(fontsize=6, loc="upper right")
                twin.legend(fontsize=6, loc="center right")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
