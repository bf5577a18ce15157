"""What an overload run shows: one row per configuration and load, the targets, and a picture."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.overload.engine_watch import Timeline
from benchmarks.overload.load import Tally, Window

QUEUE_CAP = "vllm-queued-reqs"
OURS = "sidecar"
TRACED = ("vllm", QUEUE_CAP, OURS)  # the KV panels show these three; the bars show every one


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class Row:
    """One configuration under one load, inside the measurement window."""

    config: str
    load: str
    goodput: float  # completion tokens per second of completed requests
    offered_per_s: float  # requests sent per second inside the window
    completed: int
    busy: int
    errors: int
    ttft_p50_s: float
    ttft_p99_s: float
    busy_p50_s: float
    preemptions_per_completed: float
    kv_usage_mean: float
    running_mean: float
    engine_waiting_mean: float
    kv_usage: list[tuple[float, float]] = field(default_factory=list)  # (s into window, usage)
    error_kinds: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, config: str, load: str, tally: Tally, timeline: Timeline, window: Window) -> Row:
        span = window.end - window.start
        inside = (window.start, window.end)
        return cls(
            config=config,
            load=load,
            goodput=tally.tokens / span,
            offered_per_s=tally.sent / span,
            completed=tally.completed,
            busy=tally.busy,
            errors=tally.errors,
            ttft_p50_s=quantile(tally.ttft_s, 0.5),
            ttft_p99_s=quantile(tally.ttft_s, 0.99),
            busy_p50_s=quantile(tally.busy_s, 0.5),
            preemptions_per_completed=timeline.preempted_between(*inside) / max(1, tally.completed),
            kv_usage_mean=timeline.mean("kv_usage", *inside),
            running_mean=timeline.mean("running", *inside),
            engine_waiting_mean=timeline.mean("waiting", *inside),
            kv_usage=[(s.at - window.start, s.kv_usage) for s in timeline.samples],
            error_kinds=dict(tally.error_kinds),
        )

    def line(self) -> str:
        busy = "-" if math.isnan(self.busy_p50_s) else f"{self.busy_p50_s:.2f} s"
        return (
            f"{self.load:<16} {self.config:<20} {self.goodput:>7,.0f} {self.offered_per_s:>5.1f} "
            f"{self.completed:>6} "
            f"{self.preemptions_per_completed:>7.2f} {self.ttft_p50_s:>6.2f} / "
            f"{self.ttft_p99_s:<6.2f} {busy:>8} {self.kv_usage_mean:>5.2f} "
            f"{self.running_mean:>6.1f} {self.engine_waiting_mean:>6.1f} {self.errors:>4}"
        )


HEADER = (
    f"{'load':<16} {'in front of the engine':<20} {'tok/s':>7} {'req/s':>5} {'done':>6} "
    f"{'preempt':>7} "
    f"{'TTFT p50 / p99 s':<15} {'busy p50':>8} {'KV':>5} {'run':>6} {'wait':>6} {'err':>4}"
)


def print_table(rows: list[Row]) -> None:
    print(HEADER)
    for row in sorted(rows, key=lambda r: (r.load, r.config)):
        print(row.line())


def _checks(ours: Row, peers: dict[str, Row]) -> list[tuple[str, bool]]:
    best = max((peers[name].goodput for name in ("vllm", QUEUE_CAP) if name in peers), default=0)
    checks = [(f"goodput {ours.goodput:,.0f} >= 0.95 x {best:,.0f}", ours.goodput >= 0.95 * best)]
    if QUEUE_CAP in peers:
        cap = peers[QUEUE_CAP].ttft_p99_s
        checks.append((f"TTFT p99 {ours.ttft_p99_s:.2f} <= 1.1 x {cap:.2f} s",
                       ours.ttft_p99_s <= 1.1 * cap))  # fmt: skip
    checks.append((f"preemptions {ours.preemptions_per_completed:.3f} <= 0.05 per completed",
                   ours.preemptions_per_completed <= 0.05))  # fmt: skip
    if ours.busy:
        checks.append((f"busy answer p50 {ours.busy_p50_s:.3f} <= 0.1 s", ours.busy_p50_s <= 0.1))
    return checks


def print_targets(rows: list[Row]) -> bool:
    """The issue's targets for the default sidecar on each load; True if all pass."""
    passed = True
    for load in sorted({r.load for r in rows}):
        peers = {r.config: r for r in rows if r.load == load}
        if OURS not in peers:
            continue
        for text, ok in _checks(peers[OURS], peers):
            passed &= ok
            print(f"{load:<16} {'PASS' if ok else 'MISS'}  {text}")
    return passed


def write_plot(rows: list[Row], path: Path) -> None:
    """KV usage over time of vLLM alone, with its queue cap and behind the sidecar (one panel
    per load), and every configuration's goodput per load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted({r.load for r in rows})
    configs = list(dict.fromkeys(r.config for r in rows))
    figure, axes = plt.subplots(2, len(loads), figsize=(3.6 * len(loads), 6.5), squeeze=False)
    for column, load in enumerate(loads):
        top, bottom = axes[0][column], axes[1][column]
        for row in (r for r in rows if r.load == load and r.config in TRACED):
            times = [t for t, _ in row.kv_usage]
            color = f"C{configs.index(row.config)}"
            top.plot(times, [u for _, u in row.kv_usage], color, label=row.config, linewidth=1)
        top.set_title(load)
        top.set_ylim(0, 1.05)
        top.set_xlabel("s into the measurement")
        top.set_ylabel("engine KV usage")
        goodput = {r.config: r.goodput for r in rows if r.load == load}
        bottom.bar(range(len(configs)), [goodput.get(c, 0) for c in configs],
                   color=[f"C{i}" for i in range(len(configs))])  # fmt: skip
        bottom.set_xticks(range(len(configs)), configs, rotation=40, ha="right", fontsize=8)
        bottom.set_ylabel("goodput, tokens/s")
    axes[0][0].legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
