"""`sidecar plan`: how many requests of a token budget fit in a GPU's KV cache at once, and why."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.errors import ConfigError
from sidecar.core.model.hub_cache import hub_cache_dir
from sidecar.core.model.model_spec import Model, load_model, preset_names, weights_in
from sidecar.core.model.preset_ids import HUB_IDS
from sidecar.core.plan.capacity import (
    DEFAULT_MEMORY_FRACTION,
    Budget,
    KvCost,
    MemoryFraction,
    MemoryInputs,
    Plan,
    Source,
    Term,
    make_plan,
)
from sidecar.core.plan.engine_overhead import (
    EngineSettings,
    overhead_parts,
    overhead_total,
)
from sidecar.core.plan.gpu_presets import GPUS, GpuPreset, vllm_serve_defaults
from sidecar.core.plan.parallelism import last_stage_is_fullest
from sidecar.core.sizes import parse_size
from sidecar.entry.plan_render import render

DEFAULT_PROMPT_TOKENS = 3000
DEFAULT_COMPLETION_TOKENS = 1000
DEFAULT_OVERHEAD = "2GiB"
DEFAULT_ALPHA = 0.8
DEFAULT_KV_DTYPE = "auto"
DEFAULT_TP = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of `sidecar plan`."""
    parser.epilog = _presets_help()
    parser.add_argument(
        "--model",
        required=True,
        help="config.json, model directory, preset, or Hugging Face id (local cache, then presets)",
    )
    memory = parser.add_argument_group(
        "memory (sizes: 24GiB or 24Gi = 24 x 1024^3 B, 24GB or 24G = 24 x 1000^3 B, or bytes)"
    )
    memory.add_argument("--vram", help="total memory of one GPU, as CUDA reports it")
    memory.add_argument(
        "--gpu",
        choices=sorted(GPUS),
        metavar="NAME",
        help="a GPU by name, instead of --vram: the memory CUDA reports for it "
        f"({', '.join(GPUS)})",
    )
    memory.add_argument(
        "--weights", help="weights of the whole model (default: the preset's or the files')"
    )
    memory.add_argument(
        "--overhead",
        help="per GPU: activations, non-torch memory, CUDA graphs (default: estimated from the "
        f"model and the vLLM settings below; {DEFAULT_OVERHEAD} where the config cannot tell)",
    )
    memory.add_argument(
        "--memory-fraction",
        type=float,
        help="the share of each GPU the engine sizes itself to: vLLM's --gpu-memory-utilization, "
        f"SGLang's --mem-fraction-static ({DEFAULT_MEMORY_FRACTION}, vLLM's default; "
        "1: the whole GPU)",
    )
    memory.add_argument("--kv-pool", help="the KV pool of one GPU, instead of --vram")
    engine = parser.add_argument_group(
        "vLLM settings the overhead estimate depends on (default: `vllm serve`'s for the GPU)"
    )
    engine.add_argument("--max-num-batched-tokens", type=int, help="tokens of the profiling run")
    engine.add_argument("--max-num-seqs", type=int, help="sequences of the sampler's run")
    engine.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs captured")
    engine.add_argument(
        "--cuda-graph-memory",
        help="per GPU, instead of the estimate (0 for a vLLM that sizes its pool before "
        "capturing graphs: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0, and releases before it)",
    )
    budget = parser.add_argument_group("token budget of one request")
    budget.add_argument("--max-tokens", type=int, help="prompt + completion together")
    budget.add_argument("--max-prompt-tokens", type=int, help=f"({DEFAULT_PROMPT_TOKENS})")
    budget.add_argument("--max-completion-tokens", type=int, help=f"({DEFAULT_COMPLETION_TOKENS})")
    parser.add_argument("--alpha", type=float, help=f"safety factor in (0, 1] ({DEFAULT_ALPHA})")
    parser.add_argument("--kv-dtype", help=f"auto, fp16, bf16, fp32, fp8... ({DEFAULT_KV_DTYPE})")
    parser.add_argument("--tp", type=int, help=f"tensor-parallel GPUs ({DEFAULT_TP})")
    parser.add_argument(
        "--pp", type=int, help="pipeline-parallel stages, each holding its share of the layers (1)"
    )
    parser.add_argument("--block-size", type=int, help="tokens per KV block, e.g. 16 for vLLM")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _presets_help() -> str:
    lines = ["presets (--model NAME, or one of the Hugging Face ids it answers to):"]
    for name in preset_names():
        ids = ", ".join(HUB_IDS.get(name, ()))
        lines.append(f"  {name:<22}{ids}")
    lines += [
        "",
        "A Hugging Face id is looked up in the local cache first (HF_HUB_CACHE, HF_HOME,",
        "~/.cache/huggingface/hub), never on the network.",
        "",
        "example: sidecar plan --model llama-3.1-8b --vram 80GiB",
    ]
    return "\n".join(lines)


# The inputs that have a default, by their key in --json's "inputs", with the flag that sets them.
FLAGS = {
    "kv_dtype": "--kv-dtype",
    "tensor_parallel_size": "--tp",
    "max_tokens": "--max-tokens",
    "max_prompt_tokens": "--max-prompt-tokens",
    "max_completion_tokens": "--max-completion-tokens",
    "alpha": "--alpha",
    "memory_fraction": "--memory-fraction",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
}


@dataclass
class Inputs:
    """What the plan was asked, and whether the user or a default said it."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)

    def take(self, name: str, given: Any, default: Any) -> Any:
        """The user's value when given, else the default; remembers which."""
        value = default if given is None else given
        self.values[name] = value
        self.sources[name] = Source.DEFAULT if given is None else Source.DECLARED
        return value

    def defaulted(self) -> list[str]:
        """The inputs nobody gave, as "--flag value"."""
        return [
            f"{FLAGS[name]} {self.values[name]}"
            for name, source in self.sources.items()
            if source is Source.DEFAULT
        ]


def run(args: argparse.Namespace) -> int:
    """Compute the plan and print it; bad input raises ConfigError/PlanError."""
    model = load_model(args.model, hub_cache_dir(os.environ))
    inputs = Inputs()
    plan = plan_for(model, args, inputs)
    if args.json:
        document = plan.to_dict() | {
            "model_found": model.found,
            "input_sources": {name: str(source) for name, source in inputs.sources.items()},
        }
        print(json.dumps(document, indent=2))  # noqa: T201
    else:
        print(render(plan, model, inputs.defaulted()))  # noqa: T201
    return 0


def plan_for(model: Model, args: argparse.Namespace, inputs: Inputs) -> Plan:
    """Turn parsed options into a Plan for `model`, noting in `inputs` what was defaulted."""
    cost = KvCost(
        spec=model.spec,
        kv_dtype=inputs.take("kv_dtype", args.kv_dtype, DEFAULT_KV_DTYPE),
        tp=inputs.take("tensor_parallel_size", args.tp, DEFAULT_TP),
        block_size=args.block_size,
        pp=1 if args.pp is None else args.pp,  # rare enough not to list among the defaults
    )
    budget = _budget(args, inputs)
    alpha = inputs.take("alpha", args.alpha, DEFAULT_ALPHA)
    return make_plan(cost, _memory(args, model, inputs, cost), budget, alpha)


def _budget(args: argparse.Namespace, inputs: Inputs) -> Budget:
    split = (args.max_prompt_tokens, args.max_completion_tokens)
    given = {
        flag: value
        for flag, value in zip(
            ("--max-tokens", "--max-prompt-tokens", "--max-completion-tokens"),
            (args.max_tokens, *split),
            strict=True,
        )
        if value is not None
    }
    for flag, value in given.items():
        if value <= 0:
            raise ConfigError(f"{flag} must be a positive number of tokens, got {value}")
    if args.max_tokens is not None:
        if any(value is not None for value in split):
            raise ConfigError("give --max-tokens or --max-prompt-tokens/--max-completion-tokens")
        return Budget(inputs.take("max_tokens", args.max_tokens, None), 0)
    return Budget(
        inputs.take("max_prompt_tokens", split[0], DEFAULT_PROMPT_TOKENS),
        inputs.take("max_completion_tokens", split[1], DEFAULT_COMPLETION_TOKENS),
    )


def _memory(
    args: argparse.Namespace, model: Model, inputs: Inputs, cost: KvCost
) -> MemoryInputs | Term:
    if args.kv_pool is not None:
        if any(v is not None for v in (args.vram, args.gpu, args.weights)):
            raise ConfigError("give either --kv-pool or --vram/--gpu (with --weights), not both")
        if args.memory_fraction is not None:
            raise ConfigError("--memory-fraction sizes the pool from --vram; --kv-pool is the pool")
        if _engine_flags_given(args):
            raise ConfigError("--kv-pool is the pool; the vLLM settings size an estimated overhead")
        return Term(
            name="kv_pool_per_gpu", bytes=_size("--kv-pool", args.kv_pool), source=Source.DECLARED
        )
    weights = _weights(args, model)
    vram, preset = _vram(args)
    if weights is None:
        msg = f"give --weights: {model.found} tells no weight size (or give --kv-pool)"
        raise ConfigError(msg)
    value = inputs.take("memory_fraction", args.memory_fraction, DEFAULT_MEMORY_FRACTION)
    try:
        fraction = MemoryFraction(value, inputs.sources["memory_fraction"])
    except ConfigError as exc:
        raise ConfigError(f"--memory-fraction: {exc}") from exc
    samples = last_stage_is_fullest(model.spec.layers, cost.pp)
    gpu = EngineGpu(total_bytes=vram.bytes, preset=preset, tp=cost.tp, samples=samples)
    parts = _overhead_parts(args, model, inputs, gpu)
    overhead = overhead_total(parts) if parts else _fixed_overhead(args)
    return MemoryInputs(
        vram_total=vram, weights=weights, overhead=overhead, fraction=fraction, overhead_parts=parts
    )


def _vram(args: argparse.Namespace) -> tuple[Term, GpuPreset | None]:
    """--vram as declared, or --gpu's preset figure."""
    if args.vram is not None and args.gpu is not None:
        raise ConfigError("give --vram or --gpu, not both")
    if args.gpu is not None:
        preset = GPUS[args.gpu]
        return Term(
            name="vram_total", bytes=preset.total_bytes, source=Source.PRESET, detail=preset.seen
        ), preset
    if args.vram is None:
        raise ConfigError("give --vram or --gpu (and --overhead), or --kv-pool")
    return Term(name="vram_total", bytes=_size("--vram", args.vram), source=Source.DECLARED), None


@dataclass(frozen=True, kw_only=True)
class EngineGpu:
    """What the overhead estimate needs to know about the GPUs it runs on."""

    total_bytes: int
    preset: GpuPreset | None
    tp: int
    samples: bool  # the priced GPU runs the sampler (the last pipeline stage does)


def _fixed_overhead(args: argparse.Namespace) -> Term:
    if args.overhead is not None:
        return Term(
            name="overhead", bytes=_size("--overhead", args.overhead), source=Source.DECLARED
        )
    detail = "the model's config.json tells no widths to estimate it from"
    return Term(
        name="overhead",
        bytes=_size("--overhead", DEFAULT_OVERHEAD),
        source=Source.DEFAULT,
        detail=detail,
    )


def _overhead_parts(
    args: argparse.Namespace, model: Model, inputs: Inputs, gpu: EngineGpu
) -> tuple[Term, ...]:
    """The estimated parts of the overhead; none when --overhead is declared (it wins) or the
    model's config cannot tell its widths."""
    if args.overhead is not None:
        if _engine_flags_given(args):
            msg = "--overhead is the whole overhead; the vLLM settings size its estimate instead"
            raise ConfigError(msg)
        return ()
    if model.shape is None:
        return ()
    defaults = vllm_serve_defaults(gpu.total_bytes, gpu.preset)
    settings = EngineSettings(
        max_num_batched_tokens=inputs.take(
            "max_num_batched_tokens", args.max_num_batched_tokens, defaults.max_num_batched_tokens
        ),
        max_num_seqs=inputs.take("max_num_seqs", args.max_num_seqs, defaults.max_num_seqs),
        tp=gpu.tp,
        cuda_graphs=not args.enforce_eager,
        sampler=gpu.samples,
    )
    parts = overhead_parts(model.shape, settings)
    if args.cuda_graph_memory is None:
        return parts
    declared = _size("--cuda-graph-memory", args.cuda_graph_memory)
    return (*parts[:-1], Term(name="cuda_graphs", bytes=declared, source=Source.DECLARED))


def _engine_flags_given(args: argparse.Namespace) -> bool:
    flags = (args.max_num_batched_tokens, args.max_num_seqs, args.cuda_graph_memory)
    return args.enforce_eager or any(flag is not None for flag in flags)


def _weights(args: argparse.Namespace, model: Model) -> Term | None:
    """--weights SIZE as typed, --weights auto measured from the model's files, else what the
    model's preset or files tell (None when neither tells)."""
    if args.weights is None:
        return model.weights
    if args.weights.strip().lower() != "auto":
        return Term(name="weights", bytes=_size("--weights", args.weights), source=Source.DECLARED)
    if model.directory is None:
        raise ConfigError(f"--weights auto needs a model directory, {args.model!r} is a preset")
    return weights_in(model.directory)


def _size(flag: str, text: str) -> int:
    """A size flag's bytes; the error names the flag, then says what SIDECAR_* settings say."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc
