"""What an overload run shows, from its recorded runs: a table per load (medians over the
repetitions) with the engine's best operating point beside it, the targets with a yes/NO each,
a markdown page and a summary for the JSON.

``python -m benchmarks.overload.report .bench/overload.json`` prints it again from the records.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.overload.compare import Paired
from benchmarks.overload.plan import OURS
from benchmarks.overload.targets import Report
from demo.slo import Figures
from demo.slo import median as median_figure


def _mark(ok: bool | None) -> str:
    return {True: "yes:", False: "**NO**:", None: "n/a:"}[ok]


COLUMNS = (
    "in front of the engine",
    "offered req/s",
    "SLO goodput tok/s",
    "raw tok/s",
    "met / completed",
    "TTFT p50 / p99 s",
    "busy p50 s",
    "preempt / completed",
    "KV mean",
    "running",
)


def _cells(label: str, f: Figures) -> list[str]:
    def num(x: float, fmt: str) -> str:
        return "-" if math.isnan(x) else format(x, fmt)

    return [
        label,
        num(f.offered_per_s, ".1f"),
        num(f.slo_goodput, ",.0f"),
        num(f.raw, ",.0f"),
        f"{f.met:.0f} / {f.completed:.0f}",
        f"{num(f.ttft_p50_s, '.2f')} / {num(f.ttft_p99_s, '.2f')}",
        num(f.busy_p50_s, ".3f"),
        num(f.preemptions_per_completed, ".2f"),
        num(f.kv_usage_mean, ".2f"),
        num(f.running_mean, ".1f"),
    ]


def table(report: Report, load: str) -> list[list[str]]:
    return [_cells(report.label(load, c), report.median(load, c)) for c in report.configs(load)]


def cpu_line(document: dict[str, Any]) -> str | None:
    """Where the sidecars ran, if in a cgroup of their own (OVERLOAD_SIDECAR_QUOTA,
    OVERLOAD_NEIGHBOUR)."""
    cpu = document.get("sidecar_cpu")
    if not cpu:
        return None
    quota = (
        f"a CPU quota of {_count(cpu['quota_cores'], 'core')} (cpu.cfs_quota_us "
        f"{cpu['cfs_quota_us']} a {cpu['cfs_period_us']} us period)"
        if cpu["quota_cores"]
        else "no CPU quota"
    )
    beside = "shared with a busy neighbour process" if cpu["neighbour"] else "no neighbour"
    return f"Each sidecar ran in a cgroup of its own: {quota}, {beside}."


def notes(report: Report, load: str) -> list[str]:
    """What stands beside a load's table: the engine's best operating point, and how the
    sidecar's cgroup held it."""
    return [note for note in (_best_point(report, load), _cgroup(report, load)) if note]


def _best_point(report: Report, load: str) -> str | None:
    points = report.best_points(load)
    if points:
        tok_s = median_figure(p.slo_goodput for p in points)
        at = ", ".join(str(p.clients) for p in points)
        return (
            f"the engine's best operating point: {tok_s:,.0f} tok/s of SLO goodput (median; "
            f"at {at} clients, repetition by repetition)"
        )
    runs = [r for r in report.runs if r["load"] == load]
    if report.document.get("sweep") and all(r.get("clients") is None for r in runs):
        return "no best operating point: an open loop has no client count to sweep"
    return None


def _cgroup(report: Report, load: str) -> str | None:
    runs = [r for r in report.runs if (r["load"], r["config"]) == (load, OURS)]
    groups = [r["cpu_group"] for r in runs if r.get("cpu_group")]
    if not groups:
        return None
    total = {key: sum(g[key] for g in groups) for key in groups[0]}
    throttled, periods = total["nr_throttled"], total["nr_periods"]
    neighbour = total.get("neighbour_cpu_s")
    return (
        f"the sidecar's cgroup: throttled in {throttled:,.0f} of {periods:,.0f} periods "
        f"({throttled / max(1, periods):.0%}), {total['throttled_time'] / 1e9:.1f} s in all"
        + ("" if neighbour is None else f"; the neighbour used {neighbour:.0f} CPU-s")
        + f" ({_count(len(groups), 'run')}, warm-up included)"
    )


def summary(report: Report) -> dict[str, Any]:
    """Per load, what the JSON keeps beside the records: the engine's best operating point in
    each repetition, the sidecar's SLO goodput over it and over the better engine option
    (median and worst repetition), and the targets."""

    def ratios(value: Paired | None) -> dict[str, float | str] | None:
        if value is None:
            return None
        return {"median": _number(value.median), "worst": _number(value.worst)}

    return {
        load: {
            "best_points": [asdict(p) for p in report.best_points(load)],
            "sidecar_over_best_point": ratios(report.against_best(load)),
            "sidecar_over_better_option": ratios(report.against_better_option(load)),
            "targets": [{"text": c.text, "ok": c.ok} for c in report.checks(load)],
        }
        for load in report.loads
    }


def _count(number: float, noun: str) -> str:
    return f"{number:g} {noun}" + ("" if number == 1 else "s")


def _number(value: float) -> float | str:
    """A ratio as JSON holds it: "inf" (anything over nothing) and "nan" (nothing to pair) as
    text, which strict JSON readers accept."""
    return round(value, 4) if math.isfinite(value) else str(value)


def markdown(report: Report) -> str:
    """The page: the settings, a table per load and its targets."""
    doc, objectives = report.document, report.objectives
    cpu = cpu_line(doc)
    lines = [
        f"Objectives: TTFT <= {objectives.ttft_s:g} s, mean time per output token <= "
        f"{objectives.tpot_s * 1000:g} ms. {doc['measure_s']:g} s measured after "
        f"{doc['warmup_s']:g} s of warm-up (or the load's own, where it says one); "
        + (
            f"median of {doc['repetitions']} repetitions."
            if doc["repetitions"] > 1
            else "one repetition."
        )
        + (f" {cpu}" if cpu else ""),
        "",
    ]
    for load in report.loads:
        lines += [f"**{load}** ({doc['loads'].get(load, '')})", ""]
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in table(report, load)]
        lines += ["", *(f"{note[0].upper()}{note[1:]}." for note in notes(report, load))]
        lines += ["", *(f"- {_mark(c.ok)} {c.text}" for c in report.checks(load)), ""]
    return "\n".join(lines)


def print_report(report: Report) -> bool:
    """A table per load and the targets; True if every measured target was met."""
    widths = (34, 7, 9, 9, 11, 13, 8, 8, 5, 7)
    head = (
        "in front of the engine",
        "req/s",
        "SLO tok/s",
        "raw tok/s",
        "met/done",
        "TTFT p50/p99",
        "busy p50",
        "preempt",
        "KV",
        "running",
    )
    passed = True
    cpu = cpu_line(report.document)
    if cpu:
        print(f"\n{cpu}")
    for load in report.loads:
        print(f"\n{load}: {report.document['loads'].get(load, '')}")
        print(" ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
        for row in table(report, load):
            print(" ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
        for note in notes(report, load):
            print(f"  {note}")
    print("\ntargets (the sidecar at its defaults; ratios: median of the repetitions' ratios)")
    for load in report.loads:
        for check in report.checks(load):
            passed &= check.ok is not False
            print(check.line())
    return passed


def main(argv: Sequence[str]) -> int:
    report = Report(json.loads(Path(argv[0]).read_text()))
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
