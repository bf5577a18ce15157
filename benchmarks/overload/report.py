"""What an overload run shows, from its recorded runs: a table per load (medians over the
repetitions), the targets with a yes/NO each, a markdown page and a picture.

``python -m benchmarks.overload.report .bench/overload.json`` prints it again from the records.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.overload.plan import ALONE, CAP, OURS
from demo.slo import Figures, Objectives, Record, figures, median, median_figures
from demo.slo import ratio as ratio_of

# Where prefill is light vLLM's cap is at home: the sidecar must keep up with it; where prefill
# is heavy it must do better. On the GPU-shaped engine: against the bare engine and its cap.
GOODPUT_TARGETS: dict[str, tuple[tuple[str, float], ...]] = {
    "closed-short": (("best", 0.95),),
    "closed-long": (("best", 1.2),),
    "open-long": (("best", 1.2),),
    "gpu-long": ((ALONE, 2.0), (CAP, 1.2)),
}
RAW_TARGET, BUSY_P50_TARGET_S = 0.9, 0.1


def run_figures(run: dict[str, Any], objectives: Objectives) -> Figures:
    """One recorded run's figures: its records and the engine's samples, inside its window."""
    records = [Record(*r) for r in run["records"]]
    samples = run["engine_samples"]  # [t, kv_usage, running, waiting, preemptions]
    inside = [s for s in samples if 0 <= s[0] <= run["window_s"]]
    preempted = inside[-1][4] - inside[0][4] if len(inside) >= 2 else 0.0
    kv, running, waiting = (mean([s[i] for s in inside]) for i in (1, 2, 3))
    return figures(
        records,
        0.0,
        run["window_s"],
        objectives,
        sent=run["sent"],
        preemptions=preempted,
        engine=(kv, running, waiting),
    )


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True, slots=True)
class Check:
    """One target on one load: what it says, the figures, met or not (None: not measured)."""

    load: str
    text: str
    ok: bool | None

    def line(self) -> str:
        mark = {True: "yes", False: "NO ", None: "n/a"}[self.ok]
        return f"{self.load:<13} {mark}  {self.text}"


class Report:
    """The recorded runs of one overload run, read per load and configuration."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.objectives = Objectives(**document["objectives"])
        # Repetition -1 is a calibration run, not part of the comparison.
        self.runs = [r for r in document["runs"] if r["rep"] >= 0]
        self.loads = list(dict.fromkeys(r["load"] for r in self.runs))
        self.figures: dict[tuple[str, str], list[Figures]] = {}
        for run in sorted(self.runs, key=lambda r: r["rep"]):
            key = (run["load"], run["config"])
            self.figures.setdefault(key, []).append(run_figures(run, self.objectives))

    def configs(self, load: str) -> list[str]:
        return [c for (name, c) in self.figures if name == load]

    def label(self, load: str, config: str) -> str:
        run = next(r for r in self.runs if (r["load"], r["config"]) == (load, config))
        return str(run["label"])

    def median(self, load: str, config: str) -> Figures:
        return median_figures(self.figures[(load, config)])

    def per_rep_ratio(self, load: str, field: str, against: Sequence[str]) -> float:
        """The median over repetitions of ours / the best of ``against``, each repetition's
        figures paired (they ran minutes apart, through the same drift). Anything over nothing
        is infinitely more; nothing over nothing is 0 (no win); NaN: no repetition to pair."""
        ours = self.figures[(load, OURS)]
        peers = [self.figures[(load, c)] for c in against]
        ratios = [
            ratio_of(getattr(mine, field), max(getattr(p[i], field) for p in peers))
            for i, mine in enumerate(ours)
            if all(i < len(p) for p in peers)
        ]
        return median(0.0 if math.isnan(r) else r for r in ratios)

    def checks(self, load: str) -> list[Check]:
        present = set(self.configs(load))
        if OURS not in present:
            return []
        checks = [
            self._goodput(load, peer, target, present)
            for peer, target in GOODPUT_TARGETS.get(load, ())
        ]
        ours = self.median(load, OURS)
        if ALONE in present:
            raw = self.per_rep_ratio(load, "raw", [ALONE])
            checks.append(
                Check(
                    load,
                    f"raw tok/s {_x(raw)} the engine alone (>= {RAW_TARGET}x)",
                    _at_least(raw, RAW_TARGET),
                )
            )
        if CAP in present:
            cap = self.median(load, CAP).ttft_p99_s
            checks.append(
                Check(
                    load,
                    f"TTFT p99 {ours.ttft_p99_s:.2f} s <= the queue cap's {cap:.2f} s",
                    None
                    if math.isnan(ours.ttft_p99_s) or math.isnan(cap)
                    else ours.ttft_p99_s <= cap,
                )
            )
        busy = ours.busy_p50_s
        checks.append(
            Check(
                load,
                "busy answer p50 "
                + ("- (no busy answer)" if math.isnan(busy) else f"{busy:.3f} s")
                + f" <= {BUSY_P50_TARGET_S} s",
                True if math.isnan(busy) else busy <= BUSY_P50_TARGET_S,
            )
        )
        return checks

    def _goodput(self, load: str, peer: str, target: float, present: set[str]) -> Check:
        against = [c for c in (ALONE, CAP) if c in present] if peer == "best" else [peer]
        if not against or not set(against) <= present:
            return Check(load, f"SLO goodput >= {target}x {peer}: not measured", None)
        value = self.per_rep_ratio(load, "slo_goodput", against)
        name = "the better of " + " and ".join(against) if peer == "best" else peer
        return Check(
            load, f"SLO goodput {_x(value)} {name} (>= {target}x)", _at_least(value, target)
        )


def _mark(ok: bool | None) -> str:
    return {True: "yes:", False: "**NO**:", None: "n/a:"}[ok]


def _x(value: float) -> str:
    return "more than any multiple of (theirs: 0)" if math.isinf(value) else f"{value:.2f}x"


def _at_least(value: float, target: float) -> bool | None:
    return None if math.isnan(value) else value >= target


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


def markdown(report: Report) -> str:
    """The page: the settings, a table per load and its targets."""
    doc, objectives = report.document, report.objectives
    lines = [
        f"Objectives: TTFT <= {objectives.ttft_s:g} s, mean time per output token <= "
        f"{objectives.tpot_s * 1000:g} ms. {doc['measure_s']:g} s measured after "
        f"{doc['warmup_s']:g} s of warm-up (or the load's own, where it says one); "
        + (
            f"median of {doc['repetitions']} repetitions."
            if doc["repetitions"] > 1
            else "one repetition."
        ),
        "",
    ]
    for load in report.loads:
        lines += [f"**{load}** ({doc['loads'].get(load, '')})", ""]
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(row) + " |" for row in table(report, load)]
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
    for load in report.loads:
        print(f"\n{load}: {report.document['loads'].get(load, '')}")
        print(" ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
        for row in table(report, load):
            print(" ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print("\ntargets (the sidecar at its defaults; ratios: median of the repetitions' ratios)")
    for load in report.loads:
        for check in report.checks(load):
            passed &= check.ok is not False
            print(check.line())
    return passed


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


def main(argv: Sequence[str]) -> int:
    report = Report(json.loads(Path(argv[0]).read_text()))
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
