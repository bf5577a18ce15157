"""The closing comparison: one column per run, and a verdict that says where the sidecar lost.

Pure: values in, lines out, so a test can read the verdict without running anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from demo.dashboard import EngineGauges, Sample
from demo.load import FALLBACK_CODES, Tally
from demo.slo import Figures, Objectives, figures, over_time
from sidecar.entry.settings import Settings

# The objectives the sidecar holds a request to by default (SIDECAR_SLO_TTFT_MS, _TPOT_MS), which
# the demo's sidecar runs with: the bare engine is judged by the same. A busy answer is a miss.
_FIELDS = Settings.model_fields
OBJECTIVES = Objectives(
    ttft_s=_FIELDS["slo_ttft_ms"].default / 1000, tpot_s=_FIELDS["slo_tpot_ms"].default / 1000
)


@dataclass(frozen=True)
class RunResult:
    """One run as the comparison shows it."""

    label: str
    sent: int
    outcomes: dict[str, int]
    max_engine_running: int
    max_kv_usage: float
    preemptions: int
    engine_failed: int
    p50_ttft_s: float | None
    p99_ttft_s: float | None
    samples: tuple[Sample, ...] = ()
    slo_goodput: float = 0.0  # completion tokens/s of the streams that met OBJECTIVES
    raw_tokens_per_s: float = 0.0  # completion tokens/s of every completed stream
    met: int = 0  # streams that met OBJECTIVES
    # Each second of the run: its start (s into the run) and its figures (SLO goodput, busy).
    timeline: tuple[tuple[float, Figures], ...] = ()

    @property
    def completed(self) -> int:
        """Streams that ran to their end."""
        return self.outcomes.get("completed", 0)

    @property
    def busy(self) -> int:
        """Busy answers the sidecar gave."""
        return sum(n for code, n in self.outcomes.items() if code in FALLBACK_CODES)

    @property
    def unanswered(self) -> int:
        """Requests still without an answer when the run stopped."""
        return self.sent - sum(self.outcomes.values())


def result_of(
    label: str,
    tally: Tally,
    phase: str,
    gauges: Sequence[EngineGauges],
    samples: tuple[Sample, ...],
    *,
    window: tuple[float, float] = (0.0, 1.0),
) -> RunResult:
    """Fold one run's tally and engine readings into its comparison column; SLO goodput counts
    the requests that ended inside ``window`` (on the clients' clock)."""
    last = gauges[-1] if gauges else EngineGauges(running=0)
    records = tally.records.get(phase, [])
    served = figures(records, *window, OBJECTIVES)
    return RunResult(
        label=label,
        sent=tally.started[phase],
        outcomes=dict(tally.by_phase.get(phase, {})),
        max_engine_running=max((g.running for g in gauges), default=0),
        max_kv_usage=max((g.kv_usage for g in gauges), default=0.0),
        preemptions=last.preemptions,
        engine_failed=last.failed,
        p50_ttft_s=tally.ttft_quantile_s(0.5, phase),
        p99_ttft_s=tally.ttft_quantile_s(0.99, phase),
        samples=samples,
        slo_goodput=served.slo_goodput,
        raw_tokens_per_s=served.raw,
        met=int(served.met),
        timeline=over_time(records, *window, OBJECTIVES),
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def format_comparison(results: Sequence[RunResult]) -> list[str]:
    """The closing table: one column per run."""
    rows: list[tuple[str, list[str]]] = [
        ("SLO goodput tok/s", [f"{r.slo_goodput:,.0f}" for r in results]),
        ("raw tok/s (completed)", [f"{r.raw_tokens_per_s:,.0f}" for r in results]),
        ("requests sent", [str(r.sent) for r in results]),
        ("streams completed", [str(r.completed) for r in results]),
        ("  of which met objectives", [str(r.met) for r in results]),
        ("busy answers (retry later)", [str(r.busy) for r in results]),
        ("streams failed (engine OOM)", [str(r.outcomes.get("error", 0)) for r in results]),
        ("no answer when stopped", [str(r.unanswered) for r in results]),
        ("engine preemptions", [str(r.preemptions) for r in results]),
        ("most running at the engine", [str(r.max_engine_running) for r in results]),
        ("peak KV use", [f"{r.max_kv_usage:.0%}" for r in results]),
        ("TTFT p50 ms (completed)", [_ms(r.p50_ttft_s) for r in results]),
        ("TTFT p99 ms (completed)", [_ms(r.p99_ttft_s) for r in results]),
    ]
    width = max(len(r.label) for r in results) + 2
    lines = [f"{'':<28}" + "".join(f"{r.label:>{width}}" for r in results)]
    lines += [f"{name:<28}" + "".join(f"{c:>{width}}" for c in cells) for name, cells in rows]
    return lines


def _check(ok: bool | None, what: str, figures: str) -> str:
    mark = "n/a" if ok is None else "yes" if ok else "NO "
    return f"  {mark}  {what}: {figures}"


def _slo_check(ours: RunResult, bare: RunResult) -> str:
    return _check(
        ours.slo_goodput >= bare.slo_goodput,
        "SLO goodput at least the bare engine's",
        f"{ours.slo_goodput:,.0f} vs {bare.slo_goodput:,.0f} tok/s",
    )


def verdict_paged(ours: RunResult, bare: RunResult) -> list[str]:
    """The paged engine's targets, each said plainly, met or not: what users feel."""
    p99_ours, p99_bare = ours.p99_ttft_s, bare.p99_ttft_s
    # Without completed streams on both sides there is nothing to compare: n/a, not a win.
    lower = None if p99_ours is None or p99_bare is None else p99_ours <= p99_bare
    return [
        f"{ours.label} against {bare.label}:",
        _slo_check(ours, bare),
        _check(
            ours.raw_tokens_per_s >= 0.9 * bare.raw_tokens_per_s,
            "raw throughput at least 0.9x the bare engine's",
            f"{ours.raw_tokens_per_s:,.0f} vs {bare.raw_tokens_per_s:,.0f} tok/s",
        ),
        _check(
            lower,
            "TTFT p99 at most the bare engine's",
            f"{_ms(p99_ours)} ms vs {_ms(p99_bare)} ms",
        ),
    ]


def verdict_oom(ours: RunResult, bare: RunResult) -> list[str]:
    """The OOM engine's target: the sidecar keeps it from running out of memory."""
    failed_ours, failed_bare = ours.outcomes.get("error", 0), bare.outcomes.get("error", 0)
    return [
        f"{ours.label} against {bare.label}:",
        _check(
            ours.engine_failed == 0,
            "the engine never ran out of KV memory",
            f"{ours.engine_failed} vs {bare.engine_failed} streams failed by the engine",
        ),
        _check(
            ours.completed >= bare.completed,
            "at least as many streams completed",
            f"{ours.completed} vs {bare.completed} ({failed_ours} vs {failed_bare} failed)",
        ),
        _slo_check(ours, bare),
    ]
