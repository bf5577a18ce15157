"""The engine's headroom on each GPU: the share its memory fraction leaves free, and how much of
it other processes hold.

Pure. A neighbour never shrinks a pool the engine has allocated (vLLM sizes its pool inside
total x gpu_memory_utilization whatever else runs, and refuses to start when less is free); what
a neighbour takes is the memory the engine left free, which its activations and a restart need.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.plan.capacity import MemoryFraction
from sidecar.core.warnings import ConfigWarning, engine_headroom
from sidecar.live.engine_process import neighbour_bytes
from sidecar.live.probes import GpuSnapshot


@dataclass(frozen=True, kw_only=True)
class Headroom:
    """One GPU: the engine's share, what it leaves free, what others hold of that, what is free."""

    gpu: str
    memory_fraction: float
    engine_share_bytes: int
    left_free_bytes: int  # total - the engine's share
    others_bytes: int  # held by listed processes other than the engine
    free_bytes: int  # NVML's free memory now

    @property
    def taken_bytes(self) -> int:
        """How far other processes reach into the engine's share (0 while they fit beside it)."""
        return max(0, self.others_bytes - self.left_free_bytes)


def headroom(
    gpus: GpuSnapshot | None, fraction: MemoryFraction, engine_pid: int | None
) -> tuple[Headroom, ...]:
    """Every GPU's headroom (none without an NVML reading)."""
    if gpus is None:
        return ()
    rooms = []
    for gpu in gpus.gpus:
        share = fraction.of(gpu.total_bytes)
        rooms.append(
            Headroom(
                gpu=gpu.uuid,
                memory_fraction=fraction.value,
                engine_share_bytes=share,
                left_free_bytes=gpu.total_bytes - share,
                others_bytes=neighbour_bytes(gpu, engine_pid),
                free_bytes=gpu.free_bytes,
            )
        )
    return tuple(rooms)


def headroom_warnings(rooms: tuple[Headroom, ...]) -> tuple[ConfigWarning, ...]:
    """One engine_headroom warning, for the first GPU whose headroom other processes took."""
    for room in rooms:
        if room.taken_bytes > 0:
            return (
                engine_headroom(
                    room.gpu, room.others_bytes, room.left_free_bytes, room.memory_fraction
                ),
            )
    return ()
