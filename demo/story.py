"""What the demo says, apart from its tables: the opening, the progress bar, the end.

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
class Workload:
    """The load every run gets, and the engine it meets."""

    model: str
    clients: int
    duration_s: float
    prompt_words: int
    max_tokens: int
    completion_median_ratio: float
    pool_tokens: int
    tokens_per_s: float
    prefill_tokens_per_s: float

    @property
    def prompt_tokens(self) -> int:
        """The emulator's count: one per word, plus the chat template's 3 + 4 for one message."""
        return self.prompt_words + 7

    @property
    def median_tokens(self) -> int:
        """The median completion length the engine draws."""
        return round(self.max_tokens * self.completion_median_ratio)

    @property
    def overload(self) -> float:
        """Tokens the clients would hold at once at median lengths, over the pool."""
        return self.clients * (self.prompt_tokens + self.median_tokens) / self.pool_tokens


def gib(n: float) -> str:
    """Bytes as GiB with two decimals."""
    return f"{n / GIB:.2f} GiB"


def intro(layout: GpuLayout, workload: Workload, mode: str, engine: str = "vllm") -> list[str]:
    """What the runs are, what the engine can hold, and how the sidecar is set."""
    return [
        f"A simulated {gib(layout.total_bytes)} GPU runs an emulated paged engine serving "
        f"{workload.model}: weights {gib(layout.weights_bytes)},",
        f"overhead {gib(layout.engine_overhead_bytes)}, driver {gib(layout.driver_bytes)}, so its "
        f"KV cache holds {gib(layout.kv_pool_bytes)} = {workload.pool_tokens:,} tokens.",
        f"It decodes {workload.tokens_per_s:.0f} tokens/s per stream and computes "
        f"{workload.prefill_tokens_per_s:,.0f} prompt tokens/s, shared by every stream",
        "in a step: a long prompt, or a preempted request prefilled again, slows them all.",
        "",
        f"{workload.clients} openai-SDK clients, each streaming one chat completion after "
        f"another for {workload.duration_s:.0f} s:",
        f"a {workload.prompt_tokens:,}-token prompt, max_tokens {workload.max_tokens}, and a "
        "completion length the engine draws (seeded) and",
        f"nobody can read from the request (median ~{workload.median_tokens} tokens). "
        f"{workload.clients} x {workload.prompt_tokens + workload.median_tokens:,} tokens "
        f"is {workload.overload:.1f}x what the KV cache holds.",
        "",
        "Same load and same seeds in every run: the sidecar at its defaults but for a budget,"
        " queue and tick",
        f"(docs/demo.md lists each; admission: {mode}),",
        *(
            [
                "then the bare engine, speaking llama.cpp's metrics: the OOM engine (fails its",
                "streams when its KV cache runs out, as llama.cpp never preempts).",
            ]
            if engine == "llamacpp"
            else [
                "then the bare engine; first the paged engine (preempts when full, like vLLM),",
                f"then the OOM engine (fails its running streams when its KV cache runs out)"
                f"{'' if engine == 'vllm' else f', speaking {engine} metrics'}.",
            ]
        ),
    ]


def progress(elapsed_s: float, total_s: float) -> str:
    """A bar and the time left, e.g. ``[#####...............] 22 s left``."""
    share = min(1.0, max(0.0, elapsed_s / total_s)) if total_s > 0 else 1.0
    filled = round(share * BAR_WIDTH)
    left = max(0.0, total_s - elapsed_s)
    return f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {left:3.0f} s left"
