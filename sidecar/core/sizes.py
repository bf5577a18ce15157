"""Memory sizes as the user writes them ("24GiB", "24GB", "24Gi", bare bytes) and as we show them.

One parser for the CLI and the SIDECAR_* settings, so both accept, round and refuse alike:

- bare bytes: ``1073741824`` (or ``1073741824B``);
- binary units, powers of 1024: ``KiB MiB GiB TiB`` and the Kubernetes spellings ``Ki Mi Gi Ti``;
- decimal units, powers of 1000: ``KB MB GB TB`` and the Kubernetes spellings ``k M G T``.

A decimal number is allowed ("1.5GiB"); a fraction of a byte is rounded down. Spellings that mean
different things to different tools (``24g``, ``24gb``: GiB to Docker and Java, GB to others)
are refused with a suggestion rather than guessed.
"""

from __future__ import annotations

import re
from decimal import Decimal

from sidecar.core.errors import ConfigError

_KIB, _KB = 1024, 1000
UNITS: dict[str, int] = {
    "": 1,
    "B": 1,
    "KiB": _KIB,
    "MiB": _KIB**2,
    "GiB": _KIB**3,
    "TiB": _KIB**4,
    "Ki": _KIB,
    "Mi": _KIB**2,
    "Gi": _KIB**3,
    "Ti": _KIB**4,
    "KB": _KB,
    "MB": _KB**2,
    "GB": _KB**3,
    "TB": _KB**4,
    "k": _KB,
    "M": _KB**2,
    "G": _KB**3,
    "T": _KB**4,
}
# "8gib" can only mean GiB: the "i" forms are read whatever their case.
_FOLDED = {unit.lower(): unit for unit in UNITS if "i" in unit}
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[A-Za-z]*)")
EXAMPLES = "24GiB, 24Gi, 24GB, 24G, 512MiB or 1073741824"


# No GPU, pool or body is this big; a larger number is a typo, and would print as float noise.
MAX_BYTES = 1024**5


def parse_size(text: str) -> int:
    """Read a size such as "24GiB", "1.5 GiB", "24GB", "24Gi", "24G" or "1073741824" as bytes.

    Raises ConfigError quoting the text when it is not a non-negative size with a known unit.
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None and _SIZE.fullmatch(text.strip().removeprefix("-")):
        raise ConfigError(f"cannot read size {text!r}: a size cannot be negative")
    if match is None:
        raise ConfigError(f"cannot read size {text!r}: expected {_expected()}")
    unit = _unit(match["unit"], match["number"], text)
    size = int(Decimal(match["number"]) * UNITS[unit])  # int() rounds a fraction of a byte down
    if size > MAX_BYTES:
        raise ConfigError(f"cannot read size {text!r}: more than 1 PiB is not a memory size here")
    return size


def _unit(spelled: str, number: str, text: str) -> str:
    if spelled in UNITS:
        return spelled
    if spelled.lower() in _FOLDED:
        return _FOLDED[spelled.lower()]
    letter = spelled[:1].upper()
    if spelled.lower() in {"k", "m", "g", "t", "kb", "mb", "gb", "tb"}:
        msg = (
            f"cannot read size {text!r}: {spelled!r} is ambiguous; write {number}{letter}iB "
            f"(or {number}{letter}i) for powers of 1024, or {number}{letter}B for powers of 1000"
        )
        raise ConfigError(msg)
    raise ConfigError(
        f"cannot read size {text!r}: unknown unit {spelled!r}; expected {_expected()}"
    )


def _expected() -> str:
    return f"a number of bytes or a number with a unit such as {EXAMPLES}"


_BINARY_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def format_size(n: int) -> str:
    """Show bytes in the largest binary unit that fits, plus the exact count.

    e.g. "1.50 GiB (1,610,612,736 B)".
    """
    for unit, scale in _BINARY_UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit} ({n:,} B)"
    return f"{n:,} B"
