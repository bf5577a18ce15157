"""vLLM's own queue cap (``--max-num-queued-reqs``), as vLLM 0.32 answers it.

vLLM counts the unfinished requests of its API server (waiting and running alike,
``AsyncLLM.check_admission``) and refuses the one that would take the count past the cap with
``QueueOverflowError``: HTTP 503, an OpenAI-shaped body whose ``type`` is the status phrase, and
no ``Retry-After``. It checks before a response starts, so a stream refused there gets the same
503; a stream that passed that check and lost a race for the last place is answered 200 and an
in-band error of code 503 (the emulator, with one event loop, has no such race).
"""

from __future__ import annotations

QUEUE_FULL_MESSAGE = (
    "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance."
)
QUEUE_FULL_TYPE = "Service Unavailable"  # vLLM writes HTTPStatus(503).phrase


class QueueCap:
    """Counts unfinished requests; ``admit`` refuses one past ``limit`` (None: no cap)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.unfinished = 0

    def admit(self) -> bool:
        """Take a place for one request, or say False (vLLM: ``current + n > max``)."""
        if self.limit is not None and self.unfinished + 1 > self.limit:
            return False
        self.unfinished += 1
        return True

    def release(self) -> None:
        """The request finished, failed or its client left."""
        self.unfinished -= 1
