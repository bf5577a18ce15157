"""SLO goodput and the other figures of one run, from its per-request records; pure arithmetic,
shared by the demo and the overload benchmark (`make bench-overload`) so that both judge alike.

SLO goodput is DistServe's measure: completion tokens per second of the requests that met their
objectives, time to first token (TTFT, from sending, so any queue wait counts) and mean time per
output token after the first (TPOT). A busy answer or an error is a miss, never served. Only
requests that ended inside the measurement window count.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Literal

Ending = Literal["completed", "busy", "error"]


@dataclass(frozen=True, slots=True)
class Record:
    """One request as its client saw it; times on the monotonic clock."""

    ending: Ending
    sent_at: float
    ended_at: float
    ttft_s: float | None = None
    tokens: int = 0
    retry_after_s: float | None = None
    detail: str = ""

    @property
    def elapsed_s(self) -> float:
        return self.ended_at - self.sent_at

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for a one-token completion)."""
        if self.ttft_s is None or self.tokens < 2:
            return 0.0
        return (self.elapsed_s - self.ttft_s) / (self.tokens - 1)


@dataclass(frozen=True, slots=True)
class Objectives:
    """What a request must meet to count towards SLO goodput (a chat user's defaults)."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1

    def met(self, record: Record) -> bool:
        """Completed, first token within ``ttft_s``, mean time per output token within
        ``tpot_s``."""
        return (
            record.ending == "completed"
            and record.ttft_s is not None
            and record.ttft_s <= self.ttft_s
            and record.tpot_s <= self.tpot_s
        )


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class Figures:
    """One configuration under one load: what users felt, and the engine's insides."""

    slo_goodput: float  # completion tokens/s of requests that met their objectives
    raw: float  # completion tokens/s of every completed request
    offered_per_s: float  # requests sent per second inside the window (retries included)
    completed: float
    met: float
    busy: float
    errors: float
    ttft_p50_s: float
    ttft_p99_s: float
    busy_p50_s: float
    preemptions_per_completed: float
    kv_usage_mean: float = math.nan
    running_mean: float = math.nan
    waiting_mean: float = math.nan


def figures(
    records: Iterable[Record],
    start: float,
    end: float,
    objectives: Objectives,
    *,
    sent: Sequence[float] = (),
    preemptions: float = 0.0,
    engine: tuple[float, float, float] = (math.nan, math.nan, math.nan),
) -> Figures:
    """The figures of the records that ended in [start, end); ``sent`` when every request was
    sent (also those that never ended), ``preemptions`` the engine's count inside, ``engine``
    its mean KV usage, running and waiting."""
    span = end - start
    inside = [r for r in records if start <= r.ended_at < end]
    done = [r for r in inside if r.ending == "completed"]
    met = [r for r in done if objectives.met(r)]
    busy = [r for r in inside if r.ending == "busy"]
    return Figures(
        slo_goodput=sum(r.tokens for r in met) / span,
        raw=sum(r.tokens for r in done) / span,
        offered_per_s=sum(start <= t < end for t in sent) / span,
        completed=len(done),
        met=len(met),
        busy=len(busy),
        errors=sum(r.ending == "error" for r in inside),
        ttft_p50_s=quantile([r.ttft_s for r in done if r.ttft_s is not None], 0.5),
        ttft_p99_s=quantile([r.ttft_s for r in done if r.ttft_s is not None], 0.99),
        busy_p50_s=quantile([r.elapsed_s for r in busy], 0.5),
        preemptions_per_completed=preemptions / max(1, len(done)),
        kv_usage_mean=engine[0],
        running_mean=engine[1],
        waiting_mean=engine[2],
    )


def over_time(
    records: Sequence[Record], start: float, end: float, objectives: Objectives, step_s: float = 1.0
) -> tuple[tuple[float, Figures], ...]:
    """[start, end) cut into windows of ``step_s``: each window's start (seconds after ``start``)
    and its figures, by the same arithmetic as the whole run's (SLO goodput in tok/s, busy
    answers counted)."""
    count = max(1, math.ceil((end - start) / step_s - 1e-9))
    edges = [start + i * step_s for i in range(count)]
    return tuple(
        (edge - start, figures(records, edge, min(end, edge + step_s), objectives))
        for edge in edges
    )


def median(values: Iterable[float]) -> float:
    """The median of the values that are numbers; NaN when none is."""
    numbers = [v for v in values if not math.isnan(v)]
    return statistics.median(numbers) if numbers else math.nan


def median_figures(repetitions: Sequence[Figures]) -> Figures:
    """Each figure's median over the repetitions (a figure missing in one, NaN, is skipped)."""
    return Figures(
        **{f.name: median(getattr(r, f.name) for r in repetitions) for f in fields(Figures)}
    )


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator; infinite for a positive numerator over 0, NaN for 0 / 0."""
    if denominator > 0:
        return numerator / denominator
    return math.inf if numerator > 0 else math.nan
