"""An emulated LLM engine that stands in for vLLM in tests, the demo and benchmarks.

It is not an inference engine: it speaks vLLM 0.32's HTTP shapes (OpenAI API, SSE, /metrics)
and models a paged KV-cache pool, so the sidecar can be exercised fast and deterministically.
"""

from emulator.app import build_app
from emulator.config import EmulatorConfig

__all__ = ["EmulatorConfig", "build_app"]
