"""Which tensor-parallel sizes vLLM accepts for a model, so a plan never prices a split it refuses.

vLLM's two rules, as its source states them:

- attention heads: ``num_attention_heads % tp == 0``, else "Total number of attention heads (H)
  must be divisible by tensor parallel size (T)" (vllm/config/model.py,
  ``ModelConfig.verify_with_parallel_config``);
- KV heads: split evenly (``num_kv_heads % tp == 0``) or, with more GPUs than KV heads, each head
  replicated on a whole number of GPUs (``tp % num_kv_heads == 0``); ``divide()`` asserts either
  (vllm/model_executor/layers/linear.py, ``QKVParallelLinear.__init__``). MLA models keep one
  latent per layer and have no KV heads to split, so only the first rule applies to them.
"""

from __future__ import annotations

from sidecar.core.errors import ConfigError
from sidecar.core.plan.config_json import LayerKind, ModelSpec

_CACHED = (LayerKind.FULL, LayerKind.SLIDING)


def tensor_parallel_problems(spec: ModelSpec, tp: int) -> list[str]:
    """The rules of vLLM's that `tp` breaks for this model, each as one clause; empty when none."""
    problems = []
    heads, kv_heads = spec.num_attention_heads, spec.num_kv_heads
    if heads % tp:
        problems.append(
            f"the {heads} attention heads must divide evenly over the GPUs ({heads} % {tp} = "
            f"{heads % tp}; vLLM ModelConfig.verify_with_parallel_config)"
        )
    if spec.mla_latent_dim is None and kv_heads % tp and tp % kv_heads:
        problems.append(
            f"the {kv_heads} KV heads must divide evenly over the GPUs or the GPUs over them "
            f"({kv_heads} % {tp} = {kv_heads % tp}, {tp} % {kv_heads} = {tp % kv_heads}; "
            "vLLM QKVParallelLinear)"
        )
    return problems


def valid_tp_sizes(spec: ModelSpec) -> list[int]:
    """Every tensor-parallel size vLLM accepts for this model, smallest first."""
    return [
        tp
        for tp in range(1, spec.num_attention_heads + 1)
        if not tensor_parallel_problems(spec, tp)
    ]


def check_tensor_parallel(spec: ModelSpec, tp: int) -> None:
    """Raise ConfigError naming the broken rule when vLLM would refuse `tp` for this model."""
    problems = tensor_parallel_problems(spec, tp)
    if problems:
        sizes = ", ".join(map(str, valid_tp_sizes(spec)))
        msg = (
            f"vLLM refuses tensor parallel size {tp} for {spec.name}: {'; '.join(problems)}. "
            f"Sizes it accepts: {sizes}"
        )
        raise ConfigError(msg)


def pipeline_stages(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM splits them (vllm/distributed/utils.py, get_pp_indices):
    an even share each, the remainder one apiece to the stages before the last."""
    if not 1 <= pp <= layers:
        raise ConfigError(f"pipeline parallel size must be 1 to {layers} (the layers), got {pp}")
    sizes = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        sizes[-i] += 1
    return sizes


def _stages(layers: tuple[LayerKind, ...], pp: int) -> list[tuple[LayerKind, ...]]:
    stages, start = [], 0
    for size in pipeline_stages(len(layers), pp):
        stages.append(layers[start : start + size])
        start += size
    return stages


def _cached(stage: tuple[LayerKind, ...]) -> int:
    return sum(kind in _CACHED for kind in stage)


def fullest_pipeline_stage(layers: tuple[LayerKind, ...], pp: int) -> tuple[LayerKind, ...]:
    """The layers of the stage whose KV cache grows fastest per token (its GPUs fill first)."""
    return max(_stages(layers, pp), key=_cached)


def last_stage_is_fullest(layers: tuple[LayerKind, ...], pp: int) -> bool:
    """Whether the last stage, the one that samples, holds as many cached layers as any: its
    GPUs then price the sampler's run too (with one stage, always)."""
    stages = _stages(layers, pp)
    return _cached(stages[-1]) == max(map(_cached, stages))
