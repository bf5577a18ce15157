"""GPU-aware admission controller sidecar for LLM inference servers."""

__version__ = "0.1.0"
