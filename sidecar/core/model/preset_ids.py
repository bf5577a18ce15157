"""The Hugging Face ids each built-in preset answers to (`sidecar plan --model Qwen/Qwen2.5-7B`).

Tuned variants share their base model's config.json, so one preset serves them all. Ids outside
this table still find a preset when they are a listed id's spelling variant (see model_spec).
"""

from __future__ import annotations

HUB_IDS: dict[str, tuple[str, ...]] = {
    "deepseek-v3": (
        "deepseek-ai/DeepSeek-V3",
        "deepseek-ai/DeepSeek-V3-0324",
        "deepseek-ai/DeepSeek-R1",
    ),
    "gemma-2-9b": ("google/gemma-2-9b", "google/gemma-2-9b-it"),
    "gemma-3-12b": ("google/gemma-3-12b-it", "google/gemma-3-12b-pt"),
    "gpt-oss-120b": ("openai/gpt-oss-120b",),
    "gpt-oss-20b": ("openai/gpt-oss-20b",),
    "jamba-1.5-mini": ("ai21labs/AI21-Jamba-1.5-Mini",),
    "llama-3.1-70b": (
        "meta-llama/Llama-3.1-70B",
        "meta-llama/Llama-3.1-70B-Instruct",
        "meta-llama/Meta-Llama-3.1-70B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct",
    ),
    "llama-3.1-8b": (
        "meta-llama/Llama-3.1-8B",
        "meta-llama/Llama-3.1-8B-Instruct",
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
    ),
    "mistral-7b": ("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1"),
    "mistral-small-3.1-24b": (
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        "mistralai/Mistral-Small-3.1-24B-Base-2503",
        "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
    ),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base"),
    "qwen3-32b": ("Qwen/Qwen3-32B",),
    "qwen3-8b": ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B-Base"),
}

_BY_ID = {hub_id.lower(): preset for preset, ids in HUB_IDS.items() for hub_id in ids}


def preset_for_hub_id(ref: str) -> str | None:
    """The preset a listed Hugging Face id answers to (any letter case), None when not listed."""
    return _BY_ID.get(ref.strip().lower())
