"""The targets of an overload run and its recorded runs read against them: the figures per
load and configuration (medians over the repetitions), each target met or not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.overload.compare import Paired, Point, best, paired
from benchmarks.overload.plan import ALONE, CAP, CLIENTS, OURS
from demo.slo import Figures, Objectives, Record, figures, median_figures

# Where prefill is light vLLM's cap is at home: the sidecar must keep up with it; where prefill
# is heavy it must do better. On the GPU-shaped engine: against the bare engine and its cap.
GOODPUT_TARGETS: dict[str, tuple[tuple[str, float], ...]] = {
    "closed-short": (("best", 0.95),),
    "closed-long": (("best", 1.2),),
    "open-long": (("best", 1.2),),
    "gpu-long": ((ALONE, 2.0), (CAP, 1.2)),
}
RAW_TARGET, BUSY_P50_TARGET_S = 0.9, 0.1
WORST_REPETITION_TARGET = 0.8  # no repetition below this much of the better engine option
BEST_POINT_TARGET = 0.9  # of the engine's best operating point, over the sweep


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

    def paired(self, load: str, field: str, against: Sequence[str]) -> Paired:
        """Ours / the best of ``against`` in each repetition: their median and the worst."""
        peers = [self.figures[(load, c)] for c in against]
        theirs = [max(getattr(rep, field) for rep in reps) for reps in zip(*peers, strict=False)]
        return paired([getattr(f, field) for f in self.figures[(load, OURS)]], theirs)

    def sweep_points(self, load: str) -> dict[str, int]:
        """The configurations straight at the engine and their clients, where the run swept
        client counts on this load: the sweep's points and ALONE (empty without a sweep)."""
        runs = [r for r in self.runs if r["load"] == load]
        points = {r["config"]: int(r["clients"]) for r in runs if r.get("sweep")}
        alone = [r.get("clients") or CLIENTS for r in runs if r["config"] == ALONE]
        return points | {ALONE: alone[0]} if points and alone else points

    def best_points(self, load: str) -> list[Point]:
        """The engine's best operating point in each repetition (empty without a sweep)."""
        points = self.sweep_points(load)
        reps = zip(*(self.figures[(load, c)] for c in points), strict=False)
        found = (
            best(
                Point(clients=n, slo_goodput=f.slo_goodput)
                for n, f in zip(points.values(), rep, strict=True)
            )
            for rep in reps
        )
        return [point for point in found if point is not None]

    def checks(self, load: str) -> list[Check]:
        present = set(self.configs(load))
        if OURS not in present:
            return []
        checks = [
            self._goodput(load, peer, target, present)
            for peer, target in GOODPUT_TARGETS.get(load, ())
        ]
        checks += self._repetitions(load, present)
        ours = self.median(load, OURS)
        if ALONE in present:
            raw = self.paired(load, "raw", [ALONE]).median
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
        value = self.paired(load, "slo_goodput", against).median
        name = "the better of " + " and ".join(against) if peer == "best" else peer
        return Check(
            load, f"SLO goodput {_x(value)} {name} (>= {target}x)", _at_least(value, target)
        )

    def _repetitions(self, load: str, present: set[str]) -> list[Check]:
        """No repetition below WORST_REPETITION_TARGET of the better engine option; SLO goodput
        at least BEST_POINT_TARGET of the engine's best operating point, where swept."""
        checks = []
        better = self.against_better_option(load)
        if better is not None:
            options = " and ".join(c for c in (ALONE, CAP) if c in present)
            checks.append(
                Check(
                    load,
                    f"SLO goodput's worst repetition {_x(better.worst)} the better of {options} "
                    f"(>= {WORST_REPETITION_TARGET}x)",
                    _at_least(better.worst, WORST_REPETITION_TARGET),
                )
            )
        against = self.against_best(load)
        if against is not None:
            checks.append(
                Check(
                    load,
                    f"SLO goodput {_x(against.median)} the engine's best operating point (worst "
                    f"repetition {_x(against.worst)}; >= {BEST_POINT_TARGET}x)",
                    _at_least(against.median, BEST_POINT_TARGET),
                )
            )
        return checks

    def against_better_option(self, load: str) -> Paired | None:
        """The sidecar's SLO goodput over the better of the engine alone and its cap, per
        repetition; None where neither or not the sidecar ran on this load."""
        options = [c for c in (ALONE, CAP) if (load, c) in self.figures]
        if not options or (load, OURS) not in self.figures:
            return None
        return self.paired(load, "slo_goodput", options)

    def against_best(self, load: str) -> Paired | None:
        """The sidecar's SLO goodput over the engine's best operating point, per repetition;
        None where the run swept no client counts on this load."""
        points = self.best_points(load)
        if not points or (load, OURS) not in self.figures:
            return None
        ours = [f.slo_goodput for f in self.figures[(load, OURS)]]
        return paired(ours, [p.slo_goodput for p in points])


def _x(value: float) -> str:
    return "more than any multiple of (theirs: 0)" if math.isinf(value) else f"{value:.2f}x"


def _at_least(value: float, target: float) -> bool | None:
    return None if math.isnan(value) else value >= target
