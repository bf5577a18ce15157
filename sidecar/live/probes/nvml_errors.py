"""The one place NVML's errors become ours.

Every ``pynvml.NVMLError`` is translated by its code: a failure that may clear on its own (a lost
GPU that comes back, a timeout, a busy driver) is temporary; a missing driver or library, a call
the GPU does not support, or no permission will not get better by retrying.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from sidecar.core.errors import ProbeError, ProbeTemporaryError, ProbeUnavailableError

# NVML return codes (nvml.h), spelled out so that a code we have not classified is a test failure.
TEMPORARY: dict[int, str] = {
    1: "NVML is not initialised",
    10: "timed out",
    11: "interrupt request issue",
    15: "the GPU is lost",
    16: "the GPU needs a reset",
    19: "the GPU is in use",
    20: "the driver is out of memory",
    21: "no data yet",
    23: "insufficient resources",
    27: "the GPU is not ready",
    999: "unknown NVML error",
}
UNAVAILABLE: dict[int, str] = {
    2: "invalid argument",
    3: "not supported on this GPU",
    4: "no permission to read the GPU",
    5: "already initialised",
    6: "no such GPU",
    7: "buffer too small",
    8: "insufficient external power",
    9: "the NVIDIA driver is not loaded",
    12: "the NVML library was not found",
    13: "the driver's NVML lacks this function",
    14: "corrupted infoROM",
    17: "the operating system blocked the request",
    18: "driver/library version mismatch (NVML vs kernel module)",
    22: "vGPU ECC not supported",
    24: "frequency not supported",
    25: "NVML structure version mismatch",
    26: "deprecated call",
    28: "GPU not found",
    29: "invalid state",
    30: "reset type not supported",
}


def translate(code: int, operation: str) -> ProbeError:
    """Our error for NVML return ``code`` raised by ``operation``."""
    if code in UNAVAILABLE:
        return ProbeUnavailableError(f"NVML {operation}: {UNAVAILABLE[code]} (code {code})")
    reason = TEMPORARY.get(code, f"unclassified NVML error code {code}")
    return ProbeTemporaryError(f"NVML {operation}: {reason} (code {code})")


@contextmanager
def translated(nvml: ModuleType, operation: str) -> Iterator[None]:
    """Re-raise any NVMLError from the block as a ProbeError naming ``operation``."""
    try:
        yield
    except nvml.NVMLError as exc:
        raise translate(int(exc.value), operation) from exc


def import_nvml() -> ModuleType:
    """Import ``pynvml`` lazily, so the sidecar runs where nvidia-ml-py is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        msg = "NVML: nvidia-ml-py (pynvml) is not installed"
        raise ProbeUnavailableError(msg) from exc
