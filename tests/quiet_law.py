"""The parts of the SLO law a test's fake law does not exercise: no wait of its own beyond 3 s, no
hurried ticks, streams heard and ignored, an empty /capacity section."""

from __future__ import annotations

from typing import Any

from sidecar.core.request.claims import Claims
from sidecar.core.request.stream_timing import StreamTiming


class QuietLaw:
    """A base for fake SLO laws (``SteeredLimit``): subclasses give ``step`` and ``hold_limit``."""

    def max_wait_s(self, claims: Claims) -> float:
        return 3.0

    def grows_fast(self, in_force: int) -> bool:
        return False

    def in_flight_reach(self) -> int | None:
        return None

    def asked(self, tokens: int) -> None:
        return None

    def track(self, timing: StreamTiming, claims: Claims) -> None:
        return None

    def ended(self, timing: StreamTiming, completed: bool) -> None:
        return None

    def document(self) -> dict[str, Any]:
        return {}
