"""Whether the engine answers, judged from the age of its last good reading when asked.

The capacity loop records each tick's engine reading here; readiness asks at request time, so a
loop that hangs makes the engine look unreachable by itself, without another tick.
"""

from __future__ import annotations

from sidecar.live.sources import Readings


class EngineHealth:
    """The last good engine reading's time, the last error, and the engine's max_model_len."""

    def __init__(self) -> None:
        self.seen_at: float | None = None
        self.error: str | None = None
        # Kept once said: it is fixed for the engine's life, and the budget must not shrink back
        # to the fallback while the engine is briefly unreachable.
        self.max_model_len: int | None = None

    def observe(self, readings: Readings, now: float) -> None:
        """Record one tick's engine reading, or its failure."""
        if readings.engine is not None:
            self.seen_at, self.error = now, None
            length = readings.engine.max_model_len
            if length is not None and length > 0:  # a nonsense figure is no budget
                self.max_model_len = length
        elif readings.engine_error is not None:
            self.error = str(readings.engine_error)

    def unready(self, now: float, fresh_for_s: float) -> str | None:
        """Why the engine cannot serve now (it never answered, or not lately); None if it can."""
        error = f": {self.error}" if self.error else ""
        if self.seen_at is None:
            return f"the engine has not answered yet{error}"
        age = now - self.seen_at
        if age > fresh_for_s:
            return f"the engine has not answered for {age:.1f}s{error}"
        return None
