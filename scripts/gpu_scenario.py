"""The real-GPU scenario of `make test-gpu`: a process holding memory as vLLM lays it out, a
neighbour coming and going, the engine's process gone; what NVML and the sidecar's plan say.

Runs under an interpreter with torch and nvidia-ml-py (no vLLM): the engine and the neighbour are
child processes that take GPU memory with torch (plain cudaMalloc through its allocator). The
driver reads the GPU with the sidecar's own NVML probe and sizes the pool with its own sources,
prints one table, and exits 1 if a check failed. Sizes scale with the card.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.core.model.model_spec import load_model_spec
from sidecar.core.plan.capacity import KvCost, Term
from sidecar.core.sizes import format_size
from sidecar.live.probes import EngineCacheConfig, EngineReading, GpuReading
from sidecar.live.probes.nvml import NvmlProbe
from sidecar.live.probes.static import Declared
from sidecar.live.sources import PlanInputs, Readings, plan_inputs

FRACTION = 0.9  # vLLM's default gpu_memory_utilization
SEEN_WITHIN_S = 10.0
POLL_S = 0.05

# A child that takes GPU memory with torch, one tensor per size, says "ready" and holds it until
# its stdin closes (or it is killed).
HOLDER = """
import sys, torch
held = [torch.empty(int(n), dtype=torch.uint8, device="cuda") for n in sys.argv[1:]]
torch.cuda.synchronize()
print("ready", torch.cuda.memory_reserved(), flush=True)
sys.stdin.read()
"""


@dataclass
class Row:
    """One line of the table: a step, what NVML and the plan said, and whether it held."""

    step: str
    seen: str
    pool: str
    headroom: str
    warnings: str
    took: str
    ok: bool


class Holder:
    """A child process holding GPU memory."""

    def __init__(self, python: str, sizes: list[int]) -> None:
        self.proc = subprocess.Popen(
            [python, "-c", HOLDER, *map(str, sizes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "ready":
            self.proc.kill()
            raise RuntimeError(f"the holder of {sizes} did not start")
        self.reserved = int(line[1])

    @property
    def pid(self) -> int:
        """The child's PID (NVML lists host PIDs; here they are the same namespace)."""
        return self.proc.pid

    def stop(self) -> None:
        """Close its stdin and wait; kill it if it lingers."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def wait_for(probe: NvmlProbe, done: Callable[[GpuReading], bool]) -> tuple[GpuReading, float]:
    """Read until ``done`` holds for GPU 0 (or SEEN_WITHIN_S passes): the reading and the time."""
    start = time.monotonic()
    while True:
        gpu = probe.read_now().gpus[0]
        took = time.monotonic() - start
        if done(gpu) or took > SEEN_WITHIN_S:
            return gpu, took
        time.sleep(POLL_S)


def held_by(gpu: GpuReading, pid: int) -> int | None:
    """What NVML lists ``pid`` holding, or None where it is not listed."""
    return next((p.used_bytes or 0 for p in gpu.processes if p.pid == pid), None)


def wait_gone(probe: NvmlProbe, pid: int) -> float:
    """Seconds until NVML stops listing ``pid`` (SEEN_WITHIN_S and more: it never did)."""
    return wait_for(probe, lambda gpu: held_by(gpu, pid) is None)[1]


def listed(probe: NvmlProbe) -> set[int]:
    """The PIDs NVML lists on GPU 0 now."""
    return {p.pid for p in probe.read_now().gpus[0].processes}


def appeared(probe: NvmlProbe, before: set[int], child: Holder) -> tuple[int, GpuReading, float]:
    """The PID NVML lists for a child that just started: its own, or (where NVML reports PIDs of
    another namespace) the one PID that was not listed before."""
    gpu, took = wait_for(probe, lambda g: bool({p.pid for p in g.processes} - before))
    fresh = {p.pid for p in gpu.processes} - before
    pid = child.pid if child.pid in fresh else min(fresh, default=child.pid)
    return pid, gpu, took


def short(size: int) -> str:
    """A size as GiB/MiB without the exact bytes."""
    return format_size(size).split(" (")[0]


@dataclass(frozen=True)
class Layout:
    """What the engine holds, as vLLM lays it out at FRACTION: weights, KV pool, activations."""

    total: int

    @property
    def weights(self) -> int:
        return self.total // 10

    @property
    def activations(self) -> int:
        return self.total // 100

    @property
    def kv(self) -> int:
        share = int(self.total * FRACTION)
        return share - self.weights - self.activations


def plan(layout: Layout, probe: NvmlProbe, engine_pid: int, engine_answers: bool) -> PlanInputs:
    """The sidecar's plan inputs from one NVML read: the nvml source, or the vllm source with the
    engine stating the pool it holds (as cache_config_info would)."""
    declared = Declared(
        vram_total_bytes=None,
        weights_bytes=layout.weights,
        weights_measured=False,
        overhead_bytes=layout.activations,
        kv_pool_bytes=None,
        observed_at=0.0,
    )
    cache = EngineCacheConfig(
        num_gpu_blocks=None,
        block_size=None,
        kv_cache_size_tokens=None,
        kv_cache_memory_bytes=layout.kv,
        cache_dtype="auto",
        gpu_memory_utilization=FRACTION,
    )
    engine = (
        EngineReading(
            cache=cache,
            kv_usage_ratio=0.0,
            requests_running=0.0,
            requests_waiting=0.0,
            preemptions_total=0.0,
            observed_at=0.0,
        )
        if engine_answers
        else None
    )
    readings = Readings(declared=declared, gpus=probe.read_now(), engine=engine)
    cost = KvCost(spec=load_model_spec("llama-3.1-8b"))
    source = "vllm" if engine_answers else "nvml"
    return plan_inputs(source, readings, cost, engine_pid=engine_pid, tolerance=0.10)


def pool_of(inputs: PlanInputs) -> int:
    """The pool per GPU the inputs give: the engine's figure, or the derived one."""
    memory = inputs.memory
    return memory.bytes if isinstance(memory, Term) else memory.pool_terms(1)[-1].bytes


def describe(inputs: PlanInputs) -> tuple[str, str]:
    rooms = "; ".join(
        f"others {short(h.others_bytes)}, taken {h.taken_bytes:,} B" for h in inputs.headroom
    )
    codes = ",".join(w.code for w in inputs.warnings) or "-"
    return rooms, codes


def scenario(python: str) -> list[Row]:
    probe = NvmlProbe(("0",))
    total = probe.read_now().gpus[0].total_bytes
    layout = Layout(total)
    rows: list[Row] = []
    before = listed(probe)
    engine = Holder(python, [layout.weights, layout.kv, layout.activations])
    engine_pid, gpu, took = appeared(probe, before, engine)
    seen = held_by(gpu, engine_pid) or 0
    inputs = plan(layout, probe, engine_pid, engine_answers=False)
    rooms, codes = describe(inputs)
    gap = (pool_of(inputs) - layout.kv) / layout.kv
    rows.append(
        Row(
            f"engine holds {short(layout.weights)} + {short(layout.kv)} KV + "
            f"{short(layout.activations)} (x {FRACTION})",
            f"pid {engine_pid}: {short(seen)} (torch {short(engine.reserved)})",
            f"nvml {short(pool_of(inputs))} ({gap:+.3%} of KV held)",
            rooms,
            codes,
            f"{took:.2f}s",
            0 <= seen - engine.reserved < 2 * 1024**3 and abs(gap) < 0.03,
        )
    )
    checked = plan(layout, probe, engine_pid, engine_answers=True)
    check = checked.disagreements[0] if checked.disagreements else None
    rooms, codes = describe(checked)
    rows.append(
        Row(
            "vllm source: engine states its pool",
            f"NVML's view {short(check.nvml_bytes) if check else '-'}",
            f"engine {short(pool_of(checked))} ({check.ratio:.2%} apart)" if check else "-",
            rooms,
            codes,
            "-",
            check is not None and not check.beyond_tolerance,
        )
    )
    for fraction in (0.03, 0.06):
        size = int(total * fraction)
        before = listed(probe)
        neighbour = Holder(python, [size])
        pid, gpu, took = appeared(probe, before, neighbour)
        inputs = plan(layout, probe, engine_pid, engine_answers=False)
        rooms, codes = describe(inputs)
        rows.append(
            Row(
                f"neighbour takes {short(size)}",
                f"pid {pid}: {short(held_by(gpu, pid) or 0)}",
                f"nvml {short(pool_of(inputs))}",
                rooms,
                codes,
                f"{took:.2f}s",
                pool_of(inputs) == layout.kv and inputs.headroom[0].others_bytes >= size,
            )
        )
        neighbour.stop()
        took = wait_gone(probe, pid)
        rows.append(
            Row(
                "neighbour leaves",
                "not listed",
                "-",
                "-",
                "-",
                f"{took:.2f}s",
                took < SEEN_WITHIN_S,
            )
        )
    engine.proc.kill()
    engine.proc.wait()
    took = wait_gone(probe, engine_pid)
    gone = plan(layout, probe, engine_pid, engine_answers=True)
    rooms, codes = describe(gone)
    rows.append(
        Row(
            "engine's process gone, its HTTP still answering",
            "not listed",
            f"engine {short(pool_of(gone))} (its own figure)",
            rooms,
            codes,
            f"{took:.2f}s",
            gone.disagreements == () and "engine_process_unseen" in codes,
        )
    )
    start = time.perf_counter()
    for _ in range(100):
        probe.read_now()
    read_ms = (time.perf_counter() - start) * 10
    rows.append(Row("one probe read (mean of 100)", "-", "-", "-", "-", f"{read_ms:.2f}ms", True))
    return rows


def table(rows: list[Row], gpu: GpuReading) -> str:
    head = ("step", "NVML sees", "plan's pool", "headroom", "warnings", "time", "ok")
    cells = [head] + [
        (r.step, r.seen, r.pool, r.headroom, r.warnings, r.took, "yes" if r.ok else "NO")
        for r in rows
    ]
    lines = [f"{gpu.name} {gpu.uuid}: total {format_size(gpu.total_bytes)}"]
    lines += ["| " + " | ".join(c) + " |" for c in cells[:1]]
    lines.append("|" + "---|" * len(head))
    lines += ["| " + " | ".join(c) + " |" for c in cells[1:]]
    return "\n".join(lines)


def main() -> int:
    """Run the scenario with this interpreter's torch; print the table; 1 if a check failed."""
    rows = scenario(sys.executable)
    gpu = NvmlProbe(("0",)).read_now().gpus[0]
    print(table(rows, gpu))
    failed = [r.step for r in rows if not r.ok]
    if failed:
        print(f"gpu scenario: {len(failed)} check(s) failed: {'; '.join(failed)}")
        return 1
    print(f"gpu scenario: all {len(rows)} checks held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
