"""How `sidecar plan` shows its derivation: one line per step, as a reader checks it by hand."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.core.model.model_spec import Model
from sidecar.core.plan.capacity import Plan, Source
from sidecar.core.plan.config_json import LayerKind
from sidecar.core.sizes import format_size


def render(plan: Plan, model: Model | None = None, defaulted: Sequence[str] = ()) -> str:
    """The derivation, line by line, as a reader checks it by hand; `defaulted` lists the
    inputs nobody gave ("--tp 1")."""
    lines = [*_model_lines(plan), *_memory_lines(plan), *_permit_lines(plan)]
    if model is not None and model.directory is not None:
        lines.insert(1, f"found        {model.found}")
    if defaulted:
        lines.append(f"defaults     {', '.join(defaulted)} (not given)")
    return "\n".join(lines)


def _model_lines(plan: Plan) -> list[str]:
    cost, spec = plan.cost, plan.cost.spec
    gpu = " per GPU" if cost.tp * cost.pp > 1 else ""
    layers = cost.attention_layers_per_gpu  # the fullest pipeline stage's
    if spec.mla_latent_dim is not None:
        shape = f"latent {spec.mla_latent_dim} (MLA, no K/V factor, replicated over TP)"
        factors = f"{layers} layers x {spec.mla_latent_dim}"
    else:
        heads = max(1, -(-spec.num_kv_heads // cost.tp))
        shape = f"{spec.num_kv_heads} KV heads x head_dim {spec.head_dim}"
        factors = f"2 (K and V) x {layers} layers x {heads} heads x {spec.head_dim}"
    lines = [
        f"model        {spec.name} ({spec.model_type}): {spec.attention_layers} attention layers"
        f" of {len(spec.layers)}, {shape}, dtype {spec.dtype}",
        f"KV cache     dtype {cost.kv_dtype} = {cost.element_bytes} B/element, TP {cost.tp}, "
        + (f"PP {cost.pp} (the fullest stage: {layers} layers), " if cost.pp > 1 else "")
        + (f"blocks of {cost.block_size} tokens" if cost.block_size else "no block rounding"),
        f"per token    {factors} x {cost.element_bytes} B = {cost.bytes_per_token_per_gpu:,} B{gpu}"
        + (f"; whole group {cost.bytes_per_token:,} B" if cost.tp * cost.pp > 1 else ""),
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


# The parts of an estimated overhead: shown under it, not subtracted again.
_PARTS = ("activation_peak", "non_torch", "cuda_graphs")


def _memory_lines(plan: Plan) -> list[str]:
    signs = {"vram_total": " ", "kv_pool_per_gpu": "="} | dict.fromkeys(_PARTS, " ·")
    # One GPU: weights and weights_per_gpu are the same.
    hidden = "weights" if plan.cost.tp * plan.cost.pp > 1 else "weights_per_gpu"
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
    return lines + _detail_lines(plan)


def _detail_lines(plan: Plan) -> list[str]:
    """Where the preset, estimated and default terms came from."""
    terms = {term.name: term for term in plan.terms}
    weights = terms.get("weights")
    lines = []
    if weights is not None and plan.cost.tp * plan.cost.pp > 1:
        split = f"TP {plan.cost.tp}" + (f" x PP {plan.cost.pp}" if plan.cost.pp > 1 else "")
        size = format_size(weights.bytes)
        lines.append(f"             (weights {size} {weights.source}, split over {split})")
    for name in ("vram_total", "weights", "overhead", *_PARTS):
        term = terms.get(name)
        if term is None or not term.detail or term.source is Source.DERIVED:
            continue
        if name != "overhead" or term.source is Source.DEFAULT:  # parts explain an estimate
            lines.append(f"             {name}: {term.detail}")
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
