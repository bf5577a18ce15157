"""The scale-out signal: the share of the pod's capacity its load takes, 0 idle, 1 at capacity.

A proportional autoscaler (the HPA: desired = ceil(replicas x signal / target)) sizes a fleet
only on a signal that grows with the load: at half of what the pod serves within its objectives
it must read near 0.5, not 0.1 until requests queue and then 3. So the signal is built from what
the sidecar measures on every stream against the same objectives its SLO attainment counts
(``SIDECAR_SLO_TTFT_MS``, ``SIDECAR_SLO_TPOT_MS``), as llm-d's SLO-driven autoscaler does
(P90 predicted TTFT and TPOT over their objectives; llm-d/llm-d PR #2011, 95.8 % attainment at
0.74x a static pool's GPUs). It is the largest of five terms, each read over the last
``window_s``:

- ``ttft`` and ``tpot``: how far the streams' latency has climbed from the engine's unloaded
  latency towards its objective, ``(p - base) / (1 - base)``, where ``p`` is the ``quantile``
  (P95: a pod's capacity is the load whose requests meet the objectives 95 % of the time) of
  the streams' latency over their objective and ``base`` the same ratio unloaded. A stream's
  TTFT (as the user saw it, from arrival at the sidecar, so a wait for admission counts) is a
  sample from the moment its first token is relayed; its TPOT is one while it runs, once it
  relayed ``RUNNING_MIN_TOKENS`` (its pace so far, or, stalled since its last token, the pace
  its next would give if it came now) and, once it completed, its final pace: each stream
  counts once, and a step in load reaches the term at the next read, not when the long
  streams end. A request still waiting past its TTFT
  objective, for admission or for its first token, sets ``ttft`` to at least its wait over the
  objective: a queue shows before anyone leaves it.

  ``base`` is learned from light load: each sample is tagged with the most requests that ran
  while it was measured (for TTFT, in flight or waiting), and the floor is the P10 of the
  lightest band of that load (1, 2, 3-4, 5-8, ... requests) with ``FLOOR_MIN_SAMPLES``
  samples in the last ``floor_window_s``, counted at most as ``floor_cap``: a stream run alone
  gives the engine's own unloaded step, and where the pod never ran that light, the lightest
  load it did run stands for it (reading low by that load's climb, never by more than the
  cap). An engine's step time grows with what each step computes (every stream's decode and
  the prompts that join it), so its latency climbs from ``base`` at no load to the objective
  at capacity about in proportion to the load: the term is the share of capacity in use, and
  past 1 the objective is missed. Before any band has enough samples, ``base`` is 0 (a fresh
  pod reads high rather than low).
- ``kv``: the engine's KV cache use over ``kv_full`` (1: the whole pool), the mean of the
  readings in the window: where memory, not compute, binds, the pool's share is the load's.
- ``slots``: the engine's running requests over the sequences it runs at once, the mean of the
  readings in the window: where the engine's sequence cap binds before its KV cache and its
  step hardly grows with its batch, the running sequences' share is the load's. Neither
  latency nor KV shows that load: with vLLM's ``--max-num-seqs 8`` on an H100 a decode step
  takes about as long for 8 streams as for 1, and a fleet benchmark's three pods, each running
  about 7 of its 8 sequences, read 0.22-0.35 (their KV cache about a fifth full), so the HPA
  scaled down at peak load and requests then missed their TTFT objective. The cap is
  ``SIDECAR_ENGINE_MAX_NUM_SEQS`` (vLLM does not export ``max_num_seqs``), else the slots the
  engine states (llama.cpp's ``-np``); without either there is no such term (0), never a
  learned guess.
- ``refusals``: 1 + the share of the requests that ended in the window that were refused for
  want of capacity, at any cap (``CAPACITY_REFUSALS``): 1 to 2. A refused request is demand the
  pod could not serve within its objective.

No term reads past 2 (``TERM_MAX``). Each term is a mean or a quantile over ``window_s``, so
no instant (a burst's first second, 84 queued behind 12) reaches a scrape on its own. Once
nothing runs through the sidecar and nothing waits for it, the load has ended and every term
reads 0 at once: an idle pod never holds replicas for a window.

1 is the set point: at the HPA's target of 0.8 the fleet runs each pod at 80 % of what it
serves within the objectives.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sidecar.core.laws.slo_limit import quantile
from sidecar.core.outcomes import EDGE_FAULTS, ROOM_REFUSALS

# The outcomes that refuse a request for want of capacity, at every cap the sidecar has: each
# busy answer of admission for want of room (all but too_large, a client error, and draining, a
# shutdown), and each 503 of the edge (its connection, partial-head, pre-admission and
# body-buffer caps).
CAPACITY_REFUSALS: frozenset[str] = frozenset(ROOM_REFUSALS) | {
    code for code, refusal in EDGE_FAULTS.items() if refusal.status == 503
}

TERMS = ("ttft", "tpot", "kv", "slots", "refusals")
# No term reads past 2, as the refusals' cannot: past its objective, latency says a pod is
# overloaded, not by how much (a queue's wait grows without bound where one more pod may be all it
# needs), and the HPA asks for replicas in proportion (at a target of 0.8, 2 asks for 2.5 pods
# a pod; its scale-up policy adds the rest a period later if the load needs them).
TERM_MAX = 2.0
FLOOR_QUANTILE = 0.1  # a bucket's unloaded latency: its lowest tenth, not one lucky stream
FLOOR_MIN_SAMPLES = 10  # fewer in a load band say nothing of the engine's floor
FLOOR_BAND_SAMPLES = 1024  # a band's newest samples: its P10 is as good as over more
# A running stream's pace counts once it relayed this many token events: over a few gaps, one
# step that carried other prompts' prefill would read as its whole pace (an argument: the 1.31 at
# half of capacity first blamed on it came from a bench window that held the step's arrival).
RUNNING_MIN_TOKENS = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class SaturationConfig:
    """The signal's windows and scale (module docstring; each a SIDECAR_UTILISATION_* setting)."""

    window_s: float = 30.0
    quantile: float = 0.95
    kv_full: float = 1.0
    floor_window_s: float = 3600.0
    floor_cap: float = 0.35
    max_samples: int = 4096  # a window's samples at most, newest kept

    def __post_init__(self) -> None:
        if min(self.window_s, self.floor_window_s, self.kv_full) <= 0:
            raise ValueError("windows and kv_full must be > 0")
        if not 0 < self.quantile <= 1 or not 0 <= self.floor_cap < 1:
            raise ValueError("quantile must be in (0, 1] and floor_cap in [0, 1)")
        if self.max_samples < 1:
            raise ValueError("max_samples must be >= 1")


def load_band(load: int) -> int:
    """The floor's band of a sample taken while ``load`` requests ran: 0 for 1 (or none), then
    1 for 2, 2 for 3-4, 3 for 5-8, ... (the engine's step grows with its batch: a band a
    doubling of it)."""
    return max(0, load - 1).bit_length()


class LatencyShare:
    """One latency's samples (each over its objective, tagged with the load it ran under): the
    window's quantile and the floor.

    Bounded: the window keeps its newest ``max_samples``; each load band its newest
    ``FLOOR_BAND_SAMPLES`` (at most ``max_samples``) for ``floor_window_s``."""

    def __init__(self, config: SaturationConfig) -> None:
        self.config = config
        self._window: deque[tuple[float, float]] = deque(maxlen=config.max_samples)
        self._bands: dict[int, deque[tuple[float, float]]] = {}
        self._band_size = min(FLOOR_BAND_SAMPLES, config.max_samples)

    def add(self, now: float, ratio: float, load: int) -> None:
        """A stream's latency over its objective, seen at ``now``, measured while at most
        ``load`` requests ran."""
        self._window.append((now, ratio))
        band = self._bands.setdefault(load_band(load), deque(maxlen=self._band_size))
        band.append((now, ratio))

    def base(self, now: float) -> float:
        """The unloaded ratio: the P10 of the lightest load band with enough samples in the
        last ``floor_window_s``, at most ``floor_cap``; 0 before any band has enough."""
        c = self.config
        for band in sorted(self._bands):
            samples = self._bands[band]
            while samples and now - samples[0][0] > c.floor_window_s:
                samples.popleft()
            if len(samples) >= FLOOR_MIN_SAMPLES:
                return min(quantile([r for _, r in samples], FLOOR_QUANTILE), c.floor_cap)
        return 0.0

    def share(self, now: float, running: Sequence[float] = ()) -> float:
        """``(p - base) / (1 - base)`` over the window's samples and ``running``, the ratios
        of streams still running as they stand now (each stream counted once: running, or
        ended in the window); 0 without any."""
        window = self._window
        while window and now - window[0][0] > self.config.window_s:
            window.popleft()
        samples = [r for _, r in window] + list(running)
        if not samples:
            return 0.0
        p = quantile(samples, self.config.quantile)
        base = self.base(now)
        return max(0.0, (p - base) / (1.0 - base))


class MeanWindow:
    """Readings at their times; their mean over the last ``window_s`` (bounded like the samples)."""

    def __init__(self, window_s: float, max_samples: int) -> None:
        self.window_s = window_s
        self._seen: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, now: float, value: float) -> None:
        self._seen.append((now, value))

    def mean(self, now: float) -> float:
        seen = self._seen
        while seen and now - seen[0][0] > self.window_s:
            seen.popleft()
        return sum(v for _, v in seen) / len(seen) if seen else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SaturationEvidence:
    """What is known now: each term's figure over the window, and whether any load is left."""

    ttft: float = 0.0
    waited: float = 0.0  # the oldest request waiting for admission, its wait over the objective
    tpot: float = 0.0
    kv: float = 0.0
    slots: float = 0.0  # the engine's running requests over its sequence cap (0: no cap known)
    loaded: bool = False  # requests in flight through the sidecar or waiting for it
    recent_offered: float = 0.0  # requests that ended in the window, refusals included
    recent_refused: float = 0.0  # of them, refused for want of capacity


@dataclass(frozen=True, slots=True, kw_only=True)
class Saturation:
    """The signal and the five terms it is the largest of."""

    utilisation: float
    ttft: float
    tpot: float
    kv: float
    slots: float
    refusals: float

    def to_dict(self) -> dict[str, float]:
        return {
            "utilisation": round(self.utilisation, 4),
            **{term: round(getattr(self, term), 4) for term in TERMS},
        }


IDLE = Saturation(utilisation=0.0, ttft=0.0, tpot=0.0, kv=0.0, slots=0.0, refusals=0.0)


def saturation(evidence: SaturationEvidence) -> Saturation:
    """The share of capacity in use: the largest of the terms (module docstring); 0 once the
    load has ended."""
    if not evidence.loaded:
        return IDLE
    refusals = _refusals(evidence)
    waited = evidence.waited if evidence.waited > 1 else 0.0
    ttft = min(TERM_MAX, max(evidence.ttft, waited))
    tpot, kv = min(TERM_MAX, evidence.tpot), min(TERM_MAX, evidence.kv)
    slots = min(TERM_MAX, evidence.slots)
    return Saturation(
        utilisation=max(ttft, tpot, kv, slots, refusals),
        ttft=ttft,
        tpot=tpot,
        kv=kv,
        slots=slots,
        refusals=refusals,
    )


def slot_use(
    running: float | None, *, max_num_seqs: int | None, engine_slots: int | None
) -> float | None:
    """The engine's ``running`` requests over the sequences it runs at once: ``max_num_seqs``
    (the operator's word for it), else ``engine_slots`` (the engine's own, where it states
    them); None where neither is known or the engine did not say what runs."""
    cap = max_num_seqs or engine_slots
    if not cap or running is None:
        return None
    return running / cap


def _refusals(e: SaturationEvidence) -> float:
    if e.recent_refused <= 0 or e.recent_offered <= 0:
        return 0.0
    return 1.0 + min(1.0, e.recent_refused / e.recent_offered)


class OutcomeWindow:
    """Cumulative outcome counts sampled over time; says how many requests ended, and how many
    were refused for want of capacity, within the last ``window_s``. Times are given, not read."""

    def __init__(self, window_s: float = 30.0, min_spacing_s: float = 1.0) -> None:
        self.window_s, self._spacing = window_s, min_spacing_s
        self._samples: deque[tuple[float, float, float]] = deque()

    def recent(self, now: float, counts: Mapping[str, float]) -> tuple[float, float]:
        """(ended, refused) since the oldest sample inside the window, after recording
        ``counts`` (cumulative, by outcome) as seen at ``now``."""
        total = sum(counts.values())
        refused = sum(v for k, v in counts.items() if k in CAPACITY_REFUSALS)
        samples = self._samples
        if not samples or now - samples[-1][0] >= self._spacing:
            samples.append((now, total, refused))
        while len(samples) > 1 and now - samples[1][0] >= self.window_s:
            samples.popleft()
        _, total0, refused0 = samples[0]
        return max(0.0, total - total0), max(0.0, refused - refused0)
