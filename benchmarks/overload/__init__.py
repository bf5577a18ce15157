"""The overload benchmark on a real vLLM: `make bench-overload` (python -m benchmarks.overload)."""
