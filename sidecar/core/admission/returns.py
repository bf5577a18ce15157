"""Callers told when to come back, known again when they do (pure: no I/O, no clock of its own).

A refused caller is told when capacity for it will free (:mod:`retry_hint`), and a caller that
honours it has spent its TTFT objective by then: under ``slo`` admission its wait in the queue
is what is left of that objective, nothing, so a return a moment before its place frees was
refused again and sent another lap (on the GPU-shaped burst a third to two fifths of the returns,
told 22-32 s more while places freed in the next 10-20 s). A return therefore waits up to the
bulkhead's wait for returns (``SIDECAR_RETURN_WAIT_MS``); its own queue TTL, where it claims one,
still bounds it.

A caller has no name the sidecar could trust, so a return is known by what it asks: the
fingerprint of its tenant, path and body (:func:`fingerprint`), as the `openai` SDKs, a browser
and the bench's clients all send the same request again. A promise is kept once, from
:data:`EARLY_S` before its due time (``Retry-After`` is whole seconds) to :data:`KEEP_S` after it;
a caller back earlier is a newcomer and its promise stands. At most :data:`SIZE` are kept, the
oldest told going first: a flood of refusals can only take the returns' longer wait away, never
give anyone more than the bulkhead's own.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from sidecar.core.admission.retry_hint import FORECAST_PLACES, MAX_RETRY_S

# A client reading only Retry-After (whole seconds, rounded up here; some clients round down)
# may be back up to a second before the exact retry-after-ms.
EARLY_S = 1.0
# How long after its due time a promise is kept: the longest wait ever told, for clients that
# add their own backoff or jitter to it.
KEEP_S = MAX_RETRY_S
# The most promises kept: the forecast's own horizon of places.
SIZE = FORECAST_PLACES


def fingerprint(tenant: str | None, path: str, body: bytes | None) -> bytes:
    """What a request asks, as 16 bytes: its tenant, path and body (BLAKE2b)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in ((tenant or "").encode(), path.encode(), body or b""):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.digest()


class Returns:
    """The promises made to refused callers: a fingerprint and when it is due back."""

    def __init__(self, *, size: int = SIZE) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self._size = size
        self._due: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._due)

    def pending(self, now: float) -> bool:
        """Whether any promise may still be kept at ``now``: the lapsed ones told first are
        dropped, so that once a burst's promises have lapsed no request is fingerprinted."""
        self._drop(now)
        return bool(self._due)

    def told(self, key: bytes, due_at: float, now: float) -> None:
        """A caller was refused and told to come back at ``due_at``: the latest word stands."""
        self._due.pop(key, None)
        self._due[key] = due_at
        self._drop(now)

    def _drop(self, now: float) -> None:
        """The oldest told first: past the size, or lapsed (a later one lapsed behind one still
        kept waits for it)."""
        while self._due:
            oldest_key, oldest_due = next(iter(self._due.items()))
            if len(self._due) <= self._size and oldest_due + KEEP_S >= now:
                break
            del self._due[oldest_key]

    def back(self, key: bytes, now: float) -> bool:
        """Whether a request is a caller back as told (the promise is then kept, once); one back
        too early is not, and its promise stands."""
        due = self._due.get(key)
        if due is None or now < due - EARLY_S:
            return False
        del self._due[key]
        return now <= due + KEEP_S
