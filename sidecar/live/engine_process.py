"""Which process on a GPU is the engine's, and what the others hold, from NVML's process list.

Pure. NVML reports host PIDs, which a container cannot map reliably: the engine is the process
SIDECAR_ENGINE_PID names, else the largest; memory no listed process holds is nobody's neighbour.
"""

from __future__ import annotations

from sidecar.live.probes import GpuReading


def engine_process_bytes(gpu: GpuReading, engine_pid: int | None) -> int:
    """What the engine holds: SIDECAR_ENGINE_PID's process, else the largest; all if none listed."""
    sizes = {p.pid: p.used_bytes or 0 for p in gpu.processes}
    if engine_pid is not None and engine_pid in sizes:
        return sizes[engine_pid]
    return max(sizes.values()) if sizes else gpu.used_bytes


def seen_engine_bytes(gpu: GpuReading, engine_pid: int | None, weights_per_gpu: int) -> int | None:
    """What NVML lists the engine's process holding, or None where it lists no process that can
    be the engine: SIDECAR_ENGINE_PID not listed, no process listed, or the largest holding less
    than the weights alone (NVML lost sight of it, or it freed its memory)."""
    sizes = {p.pid: p.used_bytes or 0 for p in gpu.processes}
    if engine_pid is not None:
        return sizes.get(engine_pid)
    largest = max(sizes.values(), default=None)
    return None if largest is None or largest < weights_per_gpu else largest


def neighbour_bytes(gpu: GpuReading, engine_pid: int | None) -> int:
    """Memory held by listed processes other than the engine (unlisted memory is overhead)."""
    listed = sum(p.used_bytes or 0 for p in gpu.processes)
    return max(0, listed - engine_process_bytes(gpu, engine_pid)) if gpu.processes else 0
