"""Memory sizes as the user writes them ("24GiB", "24GB", "512MiB", bare bytes) and as we show them.

Everything downstream counts integer bytes; GiB/MiB are powers of 1024, GB/MB powers of 1000.
"""

from __future__ import annotations

from pydantic import ByteSize, TypeAdapter, ValidationError

from sidecar.core.errors import ConfigError

_BYTE_SIZE = TypeAdapter(ByteSize)
_BINARY_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def parse_size(text: str) -> int:
    """Read a size such as "24GiB", "1.5 GiB", "24GB", "512MiB" or "1073741824" as bytes.

    Raises ConfigError naming the text when it is not a non-negative size with a known unit.
    """
    try:
        return int(_BYTE_SIZE.validate_python(text.strip()))
    except ValidationError as exc:
        msg = (
            f"cannot read size {text!r}: expected a number of bytes or a number with a unit "
            "such as 24GiB, 24GB, 512MiB or 1073741824"
        )
        raise ConfigError(msg) from exc


def format_size(n: int) -> str:
    """Show bytes in the largest binary unit that fits, plus the exact count.

    e.g. "1.50 GiB (1,610,612,736 B)".
    """
    for unit, scale in _BINARY_UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit} ({n:,} B)"
    return f"{n:,} B"
