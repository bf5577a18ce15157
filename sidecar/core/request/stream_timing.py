"""When a relayed stream's tokens came: time to first token at the engine and time per output token.

The relay stamps each chunk that carries token events; nothing here reads a clock. TTFT at the
engine runs from the request sent upstream to the first token event relayed back; TPOT is the
mean gap between token events after the first, as vLLM's ``request_time_per_output_token`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True, eq=False)  # by identity: open streams are kept in a dict
class StreamTiming:
    """One stream's clock readings: ``sent`` (the request went upstream), first and last token
    events, and how many token events were relayed. ``on_first`` is called once, when the first
    token event is seen (the SLO admission's start gate lets the next request start then)."""

    sent: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    on_first: Callable[[], None] | None = None

    def saw(self, tokens: int, now: float) -> None:
        """``tokens`` token events were relayed at ``now``."""
        if tokens <= 0:
            return
        if self.first is None:
            self.first = now
            if self.on_first is not None:
                self.on_first()
        self.last = now
        self.tokens += tokens

    def ttft_s(self) -> float | None:
        """From sent to the first token event; None while none came."""
        return None if self.first is None else max(0.0, self.first - self.sent)

    def tpot_s(self) -> float | None:
        """The mean gap between token events after the first; None with fewer than two."""
        if self.first is None or self.last is None or self.tokens < 2:
            return None
        return max(0.0, self.last - self.first) / (self.tokens - 1)

    def tpot_so_far_s(self, now: float) -> float | None:
        """A running stream's TPOT were it to end now: its mean gap so far, or, where it has
        stalled since its last token, at least the pace its next token would give if it came
        at ``now``; None with fewer than two token events."""
        tpot = self.tpot_s()
        if tpot is None or self.first is None:
            return None
        return max(tpot, (now - self.first) / self.tokens)

    def waiting_s(self, now: float) -> float | None:
        """How long it has waited for its first token so far; None once that came."""
        return now - self.sent if self.first is None else None
