"""`sidecar plan`: how many requests of a token budget fit in a GPU's KV cache at once, and why."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sidecar.core.capacity import Budget, KvCost, MemoryInputs, Plan, Source, Term, make_plan
from sidecar.core.errors import ConfigError
from sidecar.core.model_spec import LayerKind, load_model_spec, preset_names, weights_bytes_in
from sidecar.core.preset_ids import HUB_IDS
from sidecar.core.sizes import format_size, parse_size

DEFAULT_PROMPT_TOKENS = 3000
DEFAULT_COMPLETION_TOKENS = 1000
DEFAULT_OVERHEAD = "2GiB"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of `sidecar plan`."""
    parser.epilog = _presets_help()
    parser.add_argument(
        "--model", required=True, help="config.json, model directory, preset or Hugging Face id"
    )
    memory = parser.add_argument_group(
        "memory (sizes: 24GiB or 24Gi = 24 x 1024^3 B, 24GB or 24G = 24 x 1000^3 B, or bytes)"
    )
    memory.add_argument("--vram", help="total memory of one GPU")
    memory.add_argument("--weights", help="weights of the whole model, or 'auto' (model dir)")
    memory.add_argument("--overhead", help=f"per GPU: CUDA context etc. ({DEFAULT_OVERHEAD})")
    memory.add_argument("--kv-pool", help="the KV pool of one GPU, instead of --vram")
    budget = parser.add_argument_group("token budget of one request")
    budget.add_argument("--max-tokens", type=int, help="prompt + completion together")
    budget.add_argument("--max-prompt-tokens", type=int, help=f"({DEFAULT_PROMPT_TOKENS})")
    budget.add_argument("--max-completion-tokens", type=int, help=f"({DEFAULT_COMPLETION_TOKENS})")
    parser.add_argument("--alpha", type=float, default=0.8, help="safety factor in (0, 1] (0.8)")
    parser.add_argument("--kv-dtype", default="auto", help="auto, fp16, bf16, fp32, fp8... (auto)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (1)")
    parser.add_argument("--block-size", type=int, help="tokens per KV block, e.g. 16 for vLLM")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _presets_help() -> str:
    lines = ["presets (--model NAME, or one of the Hugging Face ids it answers to):"]
    for name in preset_names():
        ids = ", ".join(HUB_IDS.get(name, ()))
        lines.append(f"  {name:<16}{ids}")
    lines += [
        "",
        "example: sidecar plan --model qwen2.5-7b --vram 8GiB --weights 5GiB --overhead 1.5GiB \\",
        "           --max-tokens 4000 --alpha 0.8",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Compute the plan and print it; bad input raises ConfigError/PlanError."""
    plan = plan_from_args(args)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2))  # noqa: T201
    else:
        print(render(plan))  # noqa: T201
    return 0


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Turn parsed options into a Plan."""
    spec = load_model_spec(args.model)
    cost = KvCost(spec, kv_dtype=args.kv_dtype, tp=args.tp, block_size=args.block_size)
    return make_plan(cost, _memory(args), _budget(args), args.alpha)


def _budget(args: argparse.Namespace) -> Budget:
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
        return Budget(args.max_tokens, 0)
    prompt, completion = split
    return Budget(
        DEFAULT_PROMPT_TOKENS if prompt is None else prompt,
        DEFAULT_COMPLETION_TOKENS if completion is None else completion,
    )


def _memory(args: argparse.Namespace) -> MemoryInputs | Term:
    if args.kv_pool is not None:
        if args.vram is not None or args.weights is not None:
            raise ConfigError("give either --kv-pool or --vram with --weights, not both")
        return Term("kv_pool_per_gpu", _size("--kv-pool", args.kv_pool), Source.DECLARED)
    if args.vram is None or args.weights is None:
        raise ConfigError("give --vram and --weights (and --overhead), or --kv-pool")
    if args.weights.strip().lower() == "auto":
        weights = Term("weights", weights_bytes_in(_model_dir(args.model)), Source.MEASURED)
    else:
        weights = Term("weights", _size("--weights", args.weights), Source.DECLARED)
    overhead = _size("--overhead", args.overhead or DEFAULT_OVERHEAD)
    return MemoryInputs(
        vram_total=Term("vram_total", _size("--vram", args.vram), Source.DECLARED),
        weights=weights,
        overhead=Term("overhead", overhead, Source.DECLARED),
    )


def _size(flag: str, text: str) -> int:
    """A size flag's bytes; the error names the flag, then says what SIDECAR_* settings say."""
    try:
        return parse_size(text)
    except ConfigError as exc:
        raise ConfigError(f"{flag}: {exc}") from exc


def _model_dir(model: str) -> Path:
    path = Path(model)
    return path.parent if path.is_file() else path


def render(plan: Plan) -> str:
    """The derivation, line by line, as a reader checks it by hand."""
    return "\n".join([*_model_lines(plan), *_memory_lines(plan), *_permit_lines(plan)])


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
    lines: list[str] = []
    for term in plan.terms:
        if term.name == "weights" and len(plan.terms) > 1:
            continue  # shown through weights_per_gpu, which is what one GPU holds
        head = "" if lines else "memory"
        label = f"{signs.get(term.name, '-')} {term.name}"
        lines.append(f"{head:<11}{label:<20} {format_size(term.bytes):>34}  {term.source}")
    if len(plan.terms) > 1 and plan.cost.tp > 1:
        weights = plan.terms[1]
        lines.append(
            f"             (weights {format_size(weights.bytes)} split over TP {plan.cost.tp})"
        )
    return lines


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
