"""The capacity plan: KV bytes per token, the pool, the engine's overhead and the permits that fit,
from a parsed model config and the GPU's memory (pure)."""
