"""Read what the running servers report: Prometheus /metrics pages, vLLM's cache config and the
sidecar's /capacity document."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

DECODE_BUCKETS = range(1, 9)  # the one-token-wide buckets scripts/test_vllm.sh gives vLLM


def samples(text: str) -> list[Sample]:
    """Every sample of a Prometheus text page, parsed by prometheus_client (no regexes)."""
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def total(text: str, name: str, default: float | None = None, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``.

    Summing keeps the tests independent of the ``engine``/``model_name`` labels vLLM adds. A
    series that is absent is ``default`` (some only appear after the first request), or an error.
    """
    found = [
        s.value
        for s in samples(text)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    if not found and default is None:
        msg = f"no sample {name}{labels or ''} on the page"
        raise LookupError(msg)
    return sum(found) if found else float(default or 0)


def buckets(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of histogram ``name`` by upper bound, summed over label sets."""
    counts: dict[float, float] = {}
    for sample in samples(text):
        if sample.name == f"{name}_bucket":
            bound = float(sample.labels["le"])
            counts[bound] = counts.get(bound, 0.0) + sample.value
    return counts


def decode_steps(text: str) -> dict[int, float]:
    """k -> the engine steps, so far, that decoded exactly k sequences (k from 2 to 8).

    scripts/test_vllm.sh gives vLLM's ``iteration_tokens`` histogram one bucket per token count
    up to 8. A decode step of k sequences produces k tokens; a step that prefills carries a whole
    prompt, so the reading holds while every prompt is longer than 8 tokens (the callers check).
    """
    steps = buckets(text, "vllm:iteration_tokens_total")
    assert set(map(float, DECODE_BUCKETS)) <= set(steps), f"vLLM's buckets: {sorted(steps)}"
    return {k: steps[k] - steps[k - 1] for k in DECODE_BUCKETS if k > 1}


def cache_config(text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info``: vLLM's own statement of its KV cache."""
    for sample in samples(text):
        if sample.name == "vllm:cache_config_info":
            return dict(sample.labels)
    msg = "vllm:cache_config_info is missing from the page"
    raise LookupError(msg)


async def fetch_text(session: aiohttp.ClientSession, url: str) -> str:
    """GET ``url`` and return its body, failing the test on any non-200 answer."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
        response.raise_for_status()
        return await response.text()


async def capacity(session: aiohttp.ClientSession, admin_url: str) -> dict[str, Any]:
    """The sidecar's /capacity document, failing the test on any non-200 answer."""
    async with session.get(f"{admin_url}/capacity", timeout=aiohttp.ClientTimeout(total=5)) as r:
        r.raise_for_status()
        body: dict[str, Any] = await r.json()
        return body


async def outcomes(session: aiohttp.ClientSession, admin_url: str) -> dict[str, float]:
    """The sidecar's own count of finished requests, by outcome, from its /metrics."""
    text = await fetch_text(session, f"{admin_url}/metrics")
    return {
        sample.labels["outcome"]: sample.value
        for sample in samples(text)
        if sample.name == "sidecar_requests_total"
    }
