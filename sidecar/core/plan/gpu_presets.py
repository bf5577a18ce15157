"""GPUs by name, with the memory CUDA reports for them (what vLLM multiplies by
gpu_memory_utilization), not the nominal size on the box: an "80GB" H100 shows 79.22 GiB.

Each figure says where it was seen; one that no public vLLM log showed us says so.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class GpuPreset:
    """One GPU model: the total memory torch.cuda.mem_get_info() reports, and its source."""

    name: str
    total_bytes: int
    seen: str  # where the figure comes from

    @property
    def is_a100(self) -> bool:
        """vLLM keeps its smaller batch defaults on A100s whatever their memory."""
        return self.name.startswith("a100")


def _gib(hundredths: int) -> int:
    """vLLM logs GiB to two decimals; 7922 -> 79.22 GiB in bytes."""
    return hundredths * GIB // 100


GPUS: dict[str, GpuPreset] = {
    preset.name: preset
    for preset in (
        GpuPreset(
            "h100-80gb",
            _gib(7922),
            "vLLM's total_gpu_memory 79.22GiB on an H100 (vllm-project/vllm#10511)",
        ),
        GpuPreset(
            "h200",
            _gib(13997),
            "not seen in a vLLM log: NVML's 143,771 MiB less the 438 MiB an H100 shows NVML "
            "(81,559 MiB) over CUDA (79.22 GiB)",
        ),
        GpuPreset(
            "a100-80gb",
            _gib(7915),
            "not seen in a cited vLLM log: A100-SXM4-80GB, 79.15 GiB as torch reports it",
        ),
        GpuPreset(
            "a100-40gb",
            _gib(3939),
            "not seen in a cited vLLM log: A100-SXM4-40GB, 39.39 GiB as torch reports it",
        ),
        GpuPreset(
            "l4",
            _gib(2205),
            "not seen in a cited vLLM log: NVML's 23,034 MiB less the ~0.44 GiB the 24 GB cards "
            "below lose to CUDA",
        ),
        GpuPreset(
            "a10",
            _gib(2199),
            "torch's 'total capacity of 21.99 GiB' on an A10 (QwenLM/Qwen3#1387)",
        ),
        GpuPreset(
            "a10g",
            _gib(2199),
            "the A10's 21.99 GiB: the same 23,028 MiB in nvidia-smi (huggingface/local-gemma#20)",
        ),
        GpuPreset(
            "rtx-3090",
            _gib(2358),
            "vLLM's total_gpu_memory=23.58GiB on an RTX 3090 (vllm-project/vllm#10517)",
        ),
        GpuPreset(
            "rtx-4090",
            _gib(2355),
            "vLLM's 23.55 GiB x 0.98 = 23.08 GiB on RTX 4090s (vllm-project/vllm#13061)",
        ),
    )
}


@dataclass(frozen=True)
class ServeDefaults:
    """vLLM's `vllm serve` defaults for the scheduler, which size its profiling run."""

    max_num_batched_tokens: int
    max_num_seqs: int


def vllm_serve_defaults(total_bytes: int, preset: GpuPreset | None = None) -> ServeDefaults:
    """`vllm serve`'s defaults by GPU memory, as vLLM 0.32 sets them
    (vllm/engine/arg_utils.py, get_batch_defaults): 160 GiB and more, 16,384 tokens and 1,024
    sequences; 70 GiB and more except A100s, 8,192 and 1,024; otherwise 2,048 and 256."""
    if total_bytes >= 160 * GIB:
        return ServeDefaults(16384, 1024)
    if total_bytes >= 70 * GIB and not (preset is not None and preset.is_a100):
        return ServeDefaults(8192, 1024)
    return ServeDefaults(2048, 256)
