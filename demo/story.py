"""What the demo says, apart from its table: the opening, why each phase, the progress bar, the end.

Pure text from plain values, so a test can read the story without running it.
"""

from __future__ import annotations

from dataclasses import dataclass

from demo.simulated_gpu import GIB, GpuLayout

BAR_WIDTH = 20
PATH_HINT = (
    "`sidecar` itself: after `make`, run `. .venv/bin/activate` (then `sidecar --help`), "
    "or call `.venv/bin/sidecar` directly."
)


@dataclass(frozen=True)
class PlanFigures:
    """The numbers of the sidecar's plan the story quotes."""

    kv_pool_bytes: int
    request_tokens: int
    request_bytes: int
    bytes_per_token: int
    alpha: float
    permits_exact: float
    permits: int


def gib(n: float) -> str:
    """Bytes as GiB with two decimals."""
    return f"{n / GIB:.2f} GiB"


def intro(layout: GpuLayout, plan: PlanFigures, model: str, duration_s: float) -> list[str]:
    """What the run is, what the sidecar computed, and what will happen."""
    return [
        f"A simulated {gib(layout.total_bytes)} GPU runs an emulated engine serving {model}; the",
        "real sidecar sits in front of it and real openai-SDK clients stream through it.",
        "",
        f"The card: weights {gib(layout.weights_bytes)}, engine overhead "
        f"{gib(layout.engine_overhead_bytes)}, driver {gib(layout.driver_bytes)}, so the engine's",
        f"KV cache holds {gib(layout.kv_pool_bytes)} ({layout.kv_pool_bytes:,} B). The sidecar "
        "reads the card through NVML",
        f"(total - weights - overhead - other processes) and finds {plan.kv_pool_bytes:,} B: the",
        "same pool, plus the last partial KV block, which the engine leaves unused."
        if plan.kv_pool_bytes > layout.kv_pool_bytes
        else "same pool.",
        f"One request may use {plan.request_tokens:,} tokens x {plan.bytes_per_token:,} B/token = "
        f"{gib(plan.request_bytes)} at worst, so",
        f"  permits = floor({gib(plan.kv_pool_bytes)} / {gib(plan.request_bytes)} x "
        f"{plan.alpha}) = floor({plan.permits_exact:.2f}) = {plan.permits}",
        "",
        f"What happens ({duration_s:.0f} s with the sidecar, then the same burst without it; "
        "under a minute in all):",
        "  1 steady   fewer clients than permits: everything is admitted at once",
        "  2 burst    10x more clients than permits: some wait, the rest get a clean busy answer",
        "  3 neighbour another process takes GPU memory: the sidecar lowers its permits",
        "  4 gone     the neighbour leaves: the permits come back",
        "  5 the same burst straight at the engine, once preempting (like vLLM), once crashing",
        "    (an engine that runs out of memory), then both side by side with the sidecar's.",
    ]


def phase_reason(name: str, clients: int, permits: int, neighbour_bytes: int) -> str:
    """One line of why, as a phase starts."""
    reasons = {
        "steady": f"{clients} clients, under the {permits} permits: no one should wait.",
        "burst": f"{clients} clients, {clients / max(permits, 1):.0f}x the {permits} permits: "
        "the queue fills, the rest are told to come back.",
        "noisy neighbour": f"another process takes {gib(neighbour_bytes)} of the GPU: "
        "the KV pool shrinks, so must the permits.",
        "neighbour gone": "the neighbour exits: its memory, and the permits, come back.",
    }
    return f"--- {name}: {reasons.get(name, f'{clients} clients')}"


def permits_changed(old: int, plan: PlanFigures, neighbour_bytes: int) -> str:
    """The line printed when the control loop moves the permits, with its arithmetic."""
    why = f"a {gib(neighbour_bytes)} neighbour" if neighbour_bytes else "no neighbour"
    return (
        f"    permits {old} -> {plan.permits} ({why}): floor({gib(plan.kv_pool_bytes)} / "
        f"{gib(plan.request_bytes)} x {plan.alpha}) = floor({plan.permits_exact:.2f})"
    )


def progress(elapsed_s: float, total_s: float) -> str:
    """A bar and the time left, e.g. ``[#####...............] 22 s left``."""
    share = min(1.0, max(0.0, elapsed_s / total_s)) if total_s > 0 else 1.0
    filled = round(share * BAR_WIDTH)
    left = max(0.0, total_s - elapsed_s)
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {left:3.0f} s left"
