"""`sidecar plan`: how many requests of a token budget fit in a GPU's KV cache at once, and why."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.capacity import (
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
from sidecar.core.config_json import LayerKind
from sidecar.core.errors import ConfigError
from sidecar.core.hub_cache import hub_cache_dir
from sidecar.core.model_spec import Model, load_model, preset_names, weights_in
from sidecar.core.preset_ids import HUB_IDS
from sidecar.core.sizes import format_size, parse_size

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
    memory.add_argument("--vram", help="total memory of one GPU")
    memory.add_argument(
        "--weights", help="weights of the whole model (default: the preset's or the files')"
    )
    memory.add_argument("--overhead", help=f"per GPU: CUDA context etc. ({DEFAULT_OVERHEAD})")
    memory.add_argument(
        "--memory-fraction",
        type=float,
        help="the share of each GPU the engine sizes itself to: vLLM's --gpu-memory-utilization, "
        f"SGLang's --mem-fraction-static ({DEFAULT_MEMORY_FRACTION}, vLLM's default; "
        "1: the whole GPU)",
    )
    memory.add_argument("--kv-pool", help="the KV pool of one GPU, instead of --vram")
    budget = parser.add_argument_group("token budget of one request")
    budget.add_argument("--max-tokens", type=int, help="prompt + completion together")
    budget.add_argument("--max-prompt-tokens", type=int, help=f"({DEFAULT_PROMPT_TOKENS})")
    budget.add_argument("--max-completion-tokens", type=int, help=f"({DEFAULT_COMPLETION_TOKENS})")
    parser.add_argument("--alpha", type=float, help=f"safety factor in (0, 1] ({DEFAULT_ALPHA})")
    parser.add_argument("--kv-dtype", help=f"auto, fp16, bf16, fp32, fp8... ({DEFAULT_KV_DTYPE})")
    parser.add_argument("--tp", type=int, help=f"tensor-parallel GPUs ({DEFAULT_TP})")
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
        print(render(plan, model, inputs))  # noqa: T201
    return 0


def plan_for(model: Model, args: argparse.Namespace, inputs: Inputs) -> Plan:
    """Turn parsed options into a Plan for `model`, noting in `inputs` what was defaulted."""
    cost = KvCost(
        model.spec,
        kv_dtype=inputs.take("kv_dtype", args.kv_dtype, DEFAULT_KV_DTYPE),
        tp=inputs.take("tensor_parallel_size", args.tp, DEFAULT_TP),
        block_size=args.block_size,
    )
    budget = _budget(args, inputs)
    alpha = inputs.take("alpha", args.alpha, DEFAULT_ALPHA)
    return make_plan(cost, _memory(args, model, inputs), budget, alpha)


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


def _memory(args: argparse.Namespace, model: Model, inputs: Inputs) -> MemoryInputs | Term:
    if args.kv_pool is not None:
        if args.vram is not None or args.weights is not None:
            raise ConfigError("give either --kv-pool or --vram (with --weights), not both")
        if args.memory_fraction is not None:
            raise ConfigError("--memory-fraction sizes the pool from --vram; --kv-pool is the pool")
        return Term("kv_pool_per_gpu", _size("--kv-pool", args.kv_pool), Source.DECLARED)
    weights = _weights(args, model)
    if args.vram is None:
        raise ConfigError("give --vram (and --overhead), or --kv-pool")
    if weights is None:
        msg = f"give --weights: {model.found} tells no weight size (or give --kv-pool)"
        raise ConfigError(msg)
    overhead = Term("overhead", _size("--overhead", DEFAULT_OVERHEAD), Source.DEFAULT)
    if args.overhead is not None:
        overhead = Term("overhead", _size("--overhead", args.overhead), Source.DECLARED)
    vram = Term("vram_total", _size("--vram", args.vram), Source.DECLARED)
    value = inputs.take("memory_fraction", args.memory_fraction, DEFAULT_MEMORY_FRACTION)
    try:
        fraction = MemoryFraction(value, inputs.sources["memory_fraction"])
    except ConfigError as exc:
        raise ConfigError(f"--memory-fraction: {exc}") from exc
    return MemoryInputs(vram_total=vram, weights=weights, overhead=overhead, fraction=fraction)


def _weights(args: argparse.Namespace, model: Model) -> Term | None:
    """--weights SIZE as typed, --weights auto measured from the model's files, else what the
    model's preset or files tell (None when neither tells)."""
    if args.weights is None:
        return model.weights
    if args.weights.strip().lower() != "auto":
        return Term("weights", _size("--weights", args.weights), Source.DECLARED)
    if model.directory is None:
        raise ConfigError(f"--weights auto needs a model directory, {args.model!r} is a preset")
    return weights_in(model.directory)


def _size(flag: str, text: str) -> int:
    """A size flag's bytes; the error names the flag, then says what SIDECAR_* settings say."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def render(plan: Plan, model: Model | None = None, inputs: Inputs | None = None) -> str:
    """The derivation, line by line, as a reader checks it by hand."""
    lines = [*_model_lines(plan), *_memory_lines(plan), *_permit_lines(plan)]
    if model is not None and model.directory is not None:
        lines.insert(1, f"found        {model.found}")
    if inputs is not None and inputs.defaulted():
        lines.append(f"defaults     {', '.join(inputs.defaulted())} (not given)")
    return "\n".join(lines)


def _model_lines(plan: Plan) -> list[str]:
    cost, spec = plan.cost, plan.cost.spec
    gpu = " per GPU" if cost.tp > 1 else ""
    if spec.mla_latent_dim is not None:
        shape = f"latent {spec.mla_latent_dim} (MLA, no K/V factor, replicated over TP)"
        factors = f"{spec.attention_layers} layers x {spec.mla_latent_dim}"
    else:
        heads = max(1, -(-spec.num_kv_heads // cost.tp))
        shape = f"{spec.num_kv_heads} KV heads x head_dim {spec.head_dim}"
        factors = f"2 (K and V) x {spec.attention_layers} layers x {heads} heads x {spec.head_dim}"
    lines = [
        f"model        {spec.name} ({spec.model_type}): {spec.attention_layers} attention layers"
        f" of {len(spec.layers)}, {shape}, dtype {spec.dtype}",
        f"KV cache     dtype {cost.kv_dtype} = {cost.element_bytes} B/element, TP {cost.tp}, "
        + (f"blocks of {cost.block_size} tokens" if cost.block_size else "no block rounding"),
        f"per token    {factors} x {cost.element_bytes} B = {cost.bytes_per_token_per_gpu:,} B{gpu}"
        + (f"; whole group {cost.bytes_per_token:,} B" if cost.tp > 1 else ""),
    ]
    sliding = spec.layers.count(LayerKind.SLIDING)
    if sliding:
        lines.append(f"window       {sliding} layers hold at most {spec.sliding_window:,} tokens")
    if spec.state_bytes_per_request:
        lines.append(
            f"state        {spec.layers.count(LayerKind.STATE)} mamba/linear layers: "
            f"{format_size(spec.state_bytes_per_request)} per request, whatever its length"
        )
    budget = plan.budget
    split = f"{budget.prompt_tokens:,} prompt + {budget.completion_tokens:,} completion = "
    lines.append(
        f"per request  {split if budget.completion_tokens else ''}{budget.total:,} tokens -> "
        f"{format_size(cost.request_bytes_per_gpu(budget.total))}{gpu}"
    )
    limit = spec.max_position_embeddings
    if limit is not None and budget.total > limit:
        lines.append(f"note         the budget exceeds the model's context of {limit:,} tokens")
    return lines


def _memory_lines(plan: Plan) -> list[str]:
    signs = {"vram_total": " ", "kv_pool_per_gpu": "="}
    hidden = "weights" if plan.cost.tp > 1 else "weights_per_gpu"  # tp 1: they are the same
    lines: list[str] = []
    for term in plan.terms:
        if term.name == hidden:
            continue
        head = "" if lines else "memory"
        label = f"{signs.get(term.name, '-')} {term.name}"
        if term.name == "engine_share" and plan.memory_fraction is not None:
            label = f"x {plan.memory_fraction.value} = {term.name}"
        lines.append(f"{head:<11}{label:<20} {format_size(term.bytes):>34}  {term.source}")
    if plan.memory_fraction is not None:
        said = _FRACTION_SAID_BY.get(plan.memory_fraction.source, str(plan.memory_fraction.source))
        lines.append(f"             (the engine sizes itself to vram_total x {said})")
    weights = next((term for term in plan.terms if term.name == "weights"), None)
    if weights is not None and plan.cost.tp > 1:
        lines.append(
            f"             (weights {format_size(weights.bytes)} {weights.source}, "
            f"split over TP {plan.cost.tp})"
        )
    if weights is not None and weights.detail:
        lines.append(f"             weights: {weights.detail}")
    return lines


_FRACTION_SAID_BY = {
    Source.DEFAULT: "vLLM's default --gpu-memory-utilization",
    Source.DECLARED: "--memory-fraction",
}


def _permit_lines(plan: Plan) -> list[str]:
    usable = plan.cost.usable_pool_bytes_per_gpu(plan.kv_pool_bytes_per_gpu)
    request = plan.cost.request_bytes_per_gpu(plan.budget.total)
    lines = [f"pool         holds {plan.kv_pool_tokens:,} tokens per GPU"]
    if usable != plan.kv_pool_bytes_per_gpu:
        lines.append(f"             whole blocks use {usable:,} B of it")
    lines.append(
        f"permits      floor({usable:,} / {request:,} x {plan.alpha}) = "
        f"floor({float(plan.permits_exact):.2f}) = {plan.permits}"
    )
    return lines
