"""How long the emulated engine's completions really are: max_tokens, or a seeded heavy tail.

Real completions mostly stop (EOS) far before max_tokens; a lognormal with its median at a
fraction of max_tokens, capped there, gives that shape. Clients cannot see it in advance.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from emulator.config import EmulatorConfig

Lengths = Callable[[int], int]


def completion_lengths(config: EmulatorConfig) -> Lengths:
    """max_tokens -> the completion length of the next request (1..max_tokens)."""
    ratio = config.completion_median_ratio
    if ratio is None:
        return lambda max_tokens: max_tokens
    draw = random.Random(config.seed)  # noqa: S311 - a load shape, not a secret
    sigma = config.completion_sigma

    def length(max_tokens: int) -> int:
        sample = draw.lognormvariate(math.log(max_tokens * ratio), sigma)
        return max(1, min(max_tokens, round(sample)))

    return length
