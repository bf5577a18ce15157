"""GPU memory through NVML (nvidia-ml-py): total / used / free and per-process usage per GPU.

NVML is blocking C code, so every call runs on the probe's own daemon thread (NvmlWorker), off
the event loop; close() gives a stuck call a second, then leaves it behind. The library is
initialised once, on the first read, and again only after it reported itself uninitialised.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sidecar.core.errors import ProbeError, ProbeUnavailableError
from sidecar.live.probes import GpuReading, GpuSnapshot, ProcessMemory
from sidecar.live.probes.nvml_errors import import_nvml, translate, translated
from sidecar.live.probes.nvml_worker import NvmlWorker

CLOSE_WAIT_S = 1.0

_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE for unsigned long long
_FALLBACK_CODES = {3, 13}  # not supported, function not found: use the older call


def parse_gpu_selection(text: str | None) -> tuple[str, ...]:
    """``SIDECAR_GPUS`` ("0,1" or "GPU-uuid,...") as a tuple; empty means every visible GPU."""
    if not text:
        return ()
    return tuple(part.strip() for part in text.split(",") if part.strip())


class NvmlProbe:
    """Reads the selected GPUs; ``nvml`` is the pynvml module (imported lazily when None)."""

    def __init__(
        self,
        selection: tuple[str, ...] = (),
        *,
        nvml: ModuleType | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._selection = selection
        self._nvml = nvml
        self._clock = clock
        self._initialised = False
        self._lock = threading.Lock()
        self._worker = NvmlWorker()

    async def read(self) -> GpuSnapshot:
        """Read every selected GPU; raises ProbeError (translated from NVML) when it cannot."""
        return await self._worker.run(self.read_now)

    def read_now(self) -> GpuSnapshot:
        """The blocking read, for callers already off the event loop."""
        with self._lock:
            nvml = self._ensure_initialised()
            try:
                gpus = tuple(_read_gpu(nvml, index, h) for index, h in self._handles(nvml))
            except ProbeError as exc:
                if _code_of(exc) in {1, 15}:
                    self._initialised = False  # re-initialise once the GPU or library is back
                raise
            return GpuSnapshot(gpus=gpus, observed_at=self._clock())

    async def close(self) -> None:
        """Shut NVML down if we initialised it; never waits long on a stuck call."""
        try:
            async with asyncio.timeout(CLOSE_WAIT_S):
                await self._worker.run(self._shutdown)
        except TimeoutError:
            raise ProbeUnavailableError("NVML did not shut down in time; left behind") from None
        finally:
            self._worker.stop()

    def _shutdown(self) -> None:
        with self._lock:
            if self._initialised and self._nvml is not None:
                with translated(self._nvml, "nvmlShutdown"):
                    self._nvml.nvmlShutdown()
                self._initialised = False

    def _ensure_initialised(self) -> ModuleType:
        if self._nvml is None:
            self._nvml = import_nvml()
        if not self._initialised:
            with translated(self._nvml, "nvmlInit"):
                self._nvml.nvmlInit()
            self._initialised = True
        return self._nvml

    def _handles(self, nvml: ModuleType) -> list[tuple[int, Any]]:
        with translated(nvml, "nvmlDeviceGetCount"):
            count = int(nvml.nvmlDeviceGetCount())
        everything = [(i, _by_index(nvml, i)) for i in range(count)]
        if not self._selection:
            return everything
        return [_select(nvml, wanted, everything) for wanted in self._selection]


def _code_of(exc: ProbeError) -> int | None:
    cause = exc.__cause__
    value = getattr(cause, "value", None)
    return value if isinstance(value, int) else None


def _by_index(nvml: ModuleType, index: int) -> Any:
    with translated(nvml, f"nvmlDeviceGetHandleByIndex({index})"):
        return nvml.nvmlDeviceGetHandleByIndex(index)


def _select(nvml: ModuleType, wanted: str, everything: list[tuple[int, Any]]) -> tuple[int, Any]:
    if wanted.isdigit():
        index = int(wanted)
        if index >= len(everything):
            msg = f"SIDECAR_GPUS names GPU {index} but only {len(everything)} are visible"
            raise ProbeUnavailableError(msg)
        return everything[index]
    for index, handle in everything:
        with translated(nvml, "nvmlDeviceGetUUID"):
            if _text(nvml.nvmlDeviceGetUUID(handle)) == wanted:
                return index, handle
    with translated(nvml, f"nvmlDeviceGetHandleByUUID({wanted})"):
        handle = nvml.nvmlDeviceGetHandleByUUID(wanted)
    return -1, handle


def _read_gpu(nvml: ModuleType, index: int, handle: Any) -> GpuReading:
    total, used, free, reserved = _memory(nvml, handle)
    with translated(nvml, "nvmlDeviceGetName"):
        name = _text(nvml.nvmlDeviceGetName(handle))
    with translated(nvml, "nvmlDeviceGetUUID"):
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
    return GpuReading(
        index=index,
        uuid=uuid,
        name=name,
        total_bytes=total,
        used_bytes=used,
        free_bytes=free,
        reserved_bytes=reserved,
        processes=_processes(nvml, handle),
        mig_enabled=_mig_enabled(nvml, handle),
    )


def _memory(nvml: ModuleType, handle: Any) -> tuple[int, int, int, int | None]:
    """Memory info v2 where the driver has it (it separates reserved memory), else v1."""
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    except nvml.NVMLError as exc:
        if int(exc.value) not in _FALLBACK_CODES:
            raise translate(int(exc.value), "nvmlDeviceGetMemoryInfo_v2") from exc
        with translated(nvml, "nvmlDeviceGetMemoryInfo"):
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used), int(info.free), None
    return int(info.total), int(info.used), int(info.free), int(info.reserved)


def _processes(nvml: ModuleType, handle: Any) -> tuple[ProcessMemory, ...]:
    with translated(nvml, "nvmlDeviceGetComputeRunningProcesses_v3"):
        found = nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)
    return tuple(
        ProcessMemory(
            pid=int(p.pid),
            used_bytes=None if p.usedGpuMemory in (None, _NOT_AVAILABLE) else int(p.usedGpuMemory),
        )
        for p in found
    )


def _mig_enabled(nvml: ModuleType, handle: Any) -> bool:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError as exc:
        if int(exc.value) in _FALLBACK_CODES:
            return False  # GPUs without MIG say "not supported"
        raise translate(int(exc.value), "nvmlDeviceGetMigMode") from exc
    return bool(current)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
