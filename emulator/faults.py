"""Per-request fault injection, read from the ``x-emulator-fault`` header.

``reset-after=N``: drop the TCP connection after N tokens; ``stall-after=N``: stop sending after
N tokens but keep the connection open; ``status=503``: answer that status with an OpenAI error;
``slow-first-token=SECONDS``: add a delay before the first token. Several may be joined with ``;``.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER = "x-emulator-fault"


@dataclass(frozen=True)
class Fault:
    """The faults one request asked for; the default is none."""

    reset_after: int | None = None
    stall_after: int | None = None
    status: int | None = None
    slow_first_token_s: float = 0.0


def parse_fault(header: str | None) -> Fault:
    """Read the header; an unknown or malformed directive raises ValueError naming it."""
    if not header:
        return Fault()
    values: dict[str, int | float] = {}
    for directive in filter(None, (part.strip() for part in header.split(";"))):
        name, _, raw = directive.partition("=")
        name = name.strip()
        try:
            values[name] = float(raw) if name == "slow-first-token" else int(raw)
        except ValueError:
            raise ValueError(f"bad {HEADER} directive {directive!r}") from None
        if name not in {"reset-after", "stall-after", "status", "slow-first-token"}:
            raise ValueError(f"unknown {HEADER} directive {name!r}")
        if values[name] < 0:
            raise ValueError(f"{HEADER} directive {directive!r} must not be negative")
    return Fault(
        reset_after=_int_or_none(values.get("reset-after")),
        stall_after=_int_or_none(values.get("stall-after")),
        status=_int_or_none(values.get("status")),
        slow_first_token_s=float(values.get("slow-first-token", 0.0)),
    )


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)
