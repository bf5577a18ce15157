"""A simulated GPU for the demo: one card, an engine process, and a neighbour that comes and goes.

It is a :class:`sidecar.live.probes.GpuProbe`, so the sidecar reads it through its real NVML
capacity path (``SIDECAR_CAPACITY_SOURCE=nvml``): total - weights - overhead - other
processes' memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.live.probes import GpuReading, GpuSnapshot, ProcessMemory

GIB = 1024**3
ENGINE_PID = 4242
NEIGHBOUR_PID = 5151


@dataclass(frozen=True)
class GpuLayout:
    """What sits on the card: the engine holds weights + its own overhead + its KV pool."""

    total_bytes: int
    weights_bytes: int
    engine_overhead_bytes: int  # activations, CUDA graphs: inside the engine's process
    driver_bytes: int  # held by no listed process: counts as overhead, not as a neighbour
    kv_pool_bytes: int
    name: str = "Simulated GPU 24GB"
    uuid: str = "GPU-00000000-0000-0000-0000-00000000de00"

    @property
    def engine_bytes(self) -> int:
        """The engine process's memory, as NVML lists it."""
        return self.weights_bytes + self.engine_overhead_bytes + self.kv_pool_bytes

    def reading(self, neighbour_bytes: int) -> GpuReading:
        """The card as NVML would report it with a neighbour holding ``neighbour_bytes``."""
        processes = [ProcessMemory(ENGINE_PID, self.engine_bytes)]
        if neighbour_bytes > 0:
            processes.append(ProcessMemory(NEIGHBOUR_PID, neighbour_bytes))
        used = sum(p.used_bytes or 0 for p in processes) + self.driver_bytes
        return GpuReading(
            index=0,
            uuid=self.uuid,
            name=self.name,
            total_bytes=self.total_bytes,
            # A simulation may oversubscribe the card; a real one would OOM somebody instead.
            used_bytes=used,
            free_bytes=max(0, self.total_bytes - used),
            reserved_bytes=self.driver_bytes,
            processes=tuple(processes),
            mig_enabled=False,
        )


class SimulatedGpu:
    """The probe: reads the layout plus whatever neighbour the scenario has put on the card."""

    def __init__(self, layout: GpuLayout, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.layout = layout
        self._clock = clock
        self._neighbour_bytes = 0
        self.reads = 0

    @property
    def neighbour_bytes(self) -> int:
        """Memory the neighbour process holds now (0: no neighbour)."""
        return self._neighbour_bytes

    def set_neighbour(self, used_bytes: int) -> None:
        """Start (or resize) the neighbour; 0 makes it leave."""
        if used_bytes < 0:
            raise ValueError(f"a neighbour cannot hold {used_bytes} bytes")
        self._neighbour_bytes = used_bytes

    async def read(self) -> GpuSnapshot:
        """One snapshot, as the NVML probe returns it."""
        self.reads += 1
        return GpuSnapshot(
            gpus=(self.layout.reading(self._neighbour_bytes),),
            observed_at=self._clock(),
            provenance="simulated",
        )

    async def close(self) -> None:
        """Nothing to release."""
