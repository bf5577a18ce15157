"""The live ledger of adaptive admission: what each running stream holds, and will hold.

A stream is charged what it holds now plus the growth still expected of it (learned from finished
requests, given how far it has got), in whole blocks, so its charge follows its real size while it
runs and never passes its worst case.
The relay only bumps ``relayed``; the bulkhead reads the charges when it decides. Pure, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


def in_blocks(tokens: int, block_size: int) -> int:
    """``tokens`` rounded up to whole blocks (a paged engine allocates no less)."""
    return -(-tokens // block_size) * block_size


@dataclass(slots=True, kw_only=True)
class StreamUsage:
    """One request's footprint; ``relayed`` is bumped by the relay as token events go out."""

    compartment: str
    prompt_tokens: int
    max_tokens: int
    # Tokens still expected after producing the given number per sequence (None: the worst case).
    growth: Callable[[int], int] | None = None
    sequences: int = 1
    block_size: int = 1
    relayed: int = field(default=0)

    def _held(self, completion: int) -> int:
        per_sequence = in_blocks(self.prompt_tokens + completion, self.block_size)
        return per_sequence * self.sequences

    def charge(self) -> int:
        """Tokens reserved now: what it holds, and the growth still expected of it."""
        produced = self.completion_tokens()
        left = self.max_tokens - produced
        expected = left if self.growth is None else min(left, self.growth(produced))
        return self._held(produced + expected)

    def worst(self) -> int:
        """Tokens it holds if it runs to max_tokens."""
        return self._held(self.max_tokens)

    def occupancy(self) -> int:
        """Tokens it holds at the engine now, as far as the sidecar has seen."""
        return self.prompt_tokens * self.sequences + self.relayed

    def completion_tokens(self) -> int:
        """Completion tokens per sequence so far (what the estimator learns on completion)."""
        return min(self.max_tokens, -(-self.relayed // self.sequences))


class Ledger:
    """Every running stream's usage, by admission ticket."""

    def __init__(self) -> None:
        # Public and read as a plain dict: ``if ledger.streams`` is asked twice per admission.
        self.streams: dict[int, StreamUsage] = {}
        self._charged: dict[int, int] = {}

    def open(self, ticket: int, usage: StreamUsage, charged: int) -> None:
        """A stream was granted at ``charged`` tokens."""
        self.streams[ticket] = usage
        self._charged[ticket] = charged

    def close(self, ticket: int) -> StreamUsage | None:
        """The stream ended; forget it."""
        self._charged.pop(ticket, None)
        return self.streams.pop(ticket, None)

    def grown(self) -> list[tuple[int, int]]:
        """(ticket, new charge) of every stream whose charge grew since it was last read."""
        found = []
        for ticket, usage in self.streams.items():
            charge = usage.charge()
            if charge > self._charged[ticket]:
                self._charged[ticket] = charge
                found.append((ticket, charge))
        return found

    def occupancy(self) -> int:
        """Tokens the running streams hold now (prompts plus what was relayed)."""
        return sum(usage.occupancy() for usage in self.streams.values())

    def reserved(self) -> int:
        """Tokens the running streams are charged (occupancy plus expected growth)."""
        return sum(self._charged.values())
