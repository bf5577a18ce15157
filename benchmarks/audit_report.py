"""Issue 48's audit targets and table: what one row of the audit measured in, its verdicts and
the Markdown out. Pure; :mod:`benchmarks.audit_rows` measures."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

OTHER_SERVED_MIN = 0.95  # legit requests served, from an address that is not attacking
OWN_SERVED_MIN = 0.90  # ... and from the attacker's own address
RSS_MAX_MIB = 512.0
ADDED_LATENCY_MAX_S = 1.0  # a legit request's latency over the row's baseline median
ENGINE_PER_CONNECTION_MAX = 2.0  # row 2: unread answers' requests that reach the engine

Latencies = tuple[float | None, ...]  # seconds each legit request took; None: not served


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One audit row, as measured."""

    row: int
    attack: str
    opened: int  # the attack's connections, opened in all
    most: int  # ... open at once, at most
    other: Latencies  # the legit client on another address, under attack
    own: Latencies  # the legit client on the attacker's address, under attack
    baseline_s: float | None  # legit median before the attack (None: none served)
    rss_peak_mib: float
    ended: Mapping[str, int]  # how the attack's connections ended (an answer's status, "closed")
    # Row 2: the attack's requests the engine received (at most: a legit request not served
    # is counted as the attack's), None for the other rows.
    engine_requests: int | None = None

    @property
    def engine_per_connection(self) -> float | None:
        if self.engine_requests is None or self.opened == 0:
            return None
        return self.engine_requests / self.opened


@dataclass(frozen=True)
class Verdict:
    """One target of one row: what was measured against its bound."""

    target: str
    measured: str
    bound: str
    met: bool

    def line(self, row: int) -> str:
        mark = "PASS" if self.met else "MISS"
        return f"row {row} {mark} {self.target}: {self.measured} (target {self.bound})"


def served(latencies: Latencies) -> float:
    """The share served; none sent counts as none served."""
    return sum(s is not None for s in latencies) / len(latencies) if latencies else 0.0


def served_s(m: Measured) -> list[float]:
    return [s for s in (*m.other, *m.own) if s is not None]


def added_latency_s(m: Measured) -> float | None:
    """The slowest legit request's latency over the baseline median; None if either is missing."""
    latencies = served_s(m)
    if not latencies or m.baseline_s is None:
        return None
    return max(latencies) - m.baseline_s


def _share(target: str, share: float, least: float) -> Verdict:
    return Verdict(target, f"{share:.0%}", f">= {least:.0%}", share >= least)


def verdicts(m: Measured) -> list[Verdict]:
    """Each of the row's targets, met or missed."""
    other, own, added = served(m.other), served(m.own), added_latency_s(m)
    found = [
        _share("legit served, other address", other, OTHER_SERVED_MIN),
        _share("legit served, attacker's address", own, OWN_SERVED_MIN),
        Verdict(
            "peak RSS",
            f"{m.rss_peak_mib:.0f} MiB",
            f"<= {RSS_MAX_MIB:.0f} MiB",
            m.rss_peak_mib <= RSS_MAX_MIB,
        ),
        Verdict(
            "legit added latency",
            "none served" if added is None else f"{added * 1000:.0f} ms",
            f"<= {ADDED_LATENCY_MAX_S * 1000:.0f} ms",
            added is not None and added <= ADDED_LATENCY_MAX_S,
        ),
    ]
    per_connection = m.engine_per_connection
    if m.engine_requests is not None:
        found.append(
            Verdict(
                "engine requests per attacking connection",
                "no connection" if per_connection is None else f"{per_connection:.2f}",
                f"<= {ENGINE_PER_CONNECTION_MAX:g}",
                per_connection is not None and per_connection <= ENGINE_PER_CONNECTION_MAX,
            )
        )
    return found


HEADER = (
    "| row | attack | conns opened / most | legit served other / attacker's | legit p50 / max ms "
    "| baseline ms | peak RSS MiB | engine reqs / attacking conn | targets |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def table_row(m: Measured) -> str:
    latencies = served_s(m)
    p50 = statistics.median(latencies) if latencies else None
    slowest = max(latencies) if latencies else None
    per_connection = m.engine_per_connection
    engine = "-" if per_connection is None else f"{per_connection:.2f} ({m.engine_requests})"
    missed = [v.target for v in verdicts(m) if not v.met]
    return (
        f"| {m.row} | {m.attack} | {m.opened:,} / {m.most:,} "
        f"| {served(m.other):.0%} / {served(m.own):.0%} | {_ms(p50)} / {_ms(slowest)} "
        f"| {_ms(m.baseline_s)} | {m.rss_peak_mib:.0f} | {engine} "
        f"| {'PASS' if not missed else 'MISS: ' + ', '.join(missed)} |"
    )


def markdown(rows: Sequence[Measured], heading: str) -> str:
    """The table, then every target's verdict line."""
    lines = [heading, "", HEADER, *(table_row(m) for m in rows), ""]
    lines += [v.line(m.row) for m in rows for v in verdicts(m)]
    return "\n".join(lines) + "\n"


def as_json(m: Measured) -> dict[str, object]:
    """The row's measurements and verdicts, for .bench/audit.json."""
    return {**asdict(m), "verdicts": [asdict(v) for v in verdicts(m)]}
