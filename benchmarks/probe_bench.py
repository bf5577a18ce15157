"""Event-loop time per control-loop tick spent parsing vLLM's /metrics, before and after filtering.

The text is a real vLLM 0.32 scrape (tests/fixtures/vllm-0.32/metrics-after-traffic.txt). The
parse runs on the event loop once per tick (SIDECAR_REFRESH_MS, 1 s by default), so every stream
waits for it; the target is under 1 ms. Best of BENCH_PROBE_REPEATS (200) calls each way.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from sidecar.live.probes import EngineReading
from sidecar.live.probes.engine import parse_families, parse_metrics

FIXTURE = Path(__file__).parent.parent / "tests/fixtures/vllm-0.32/metrics-after-traffic.txt"
REPEATS = int(os.environ.get("BENCH_PROBE_REPEATS", "200"))


def best_ms(parse: Callable[[str, float], EngineReading], text: str) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        parse(text, 0.0)
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def main() -> None:
    text = FIXTURE.read_text()
    assert parse_metrics(text, 0.0) == parse_families(text, 0.0)
    full, filtered = best_ms(parse_families, text), best_ms(parse_metrics, text)
    print(f"vLLM /metrics scrape: {len(text):,} chars, {text.count(chr(10))} lines")
    print(f"  parse every family (before)      {full:7.3f} ms on the loop per tick")
    print(f"  parse the families read (after)  {filtered:7.3f} ms on the loop per tick")
    print(f"  ratio before/after: {full / filtered:.1f}x")
    met = filtered < 1.0
    print(
        f"  {'PASS' if met else 'MISS'}  probe parse on the loop per tick < 1 ms: {filtered:.3f} ms"
    )


if __name__ == "__main__":
    main()
