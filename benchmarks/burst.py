"""`make bench-burst`: a burst of streaming chats onto a pod with a history, beside the engine.

96 users at once each send one streaming chat completion without ``max_tokens`` (hidden lengths:
``stop_token_ids``, temperature 1) and honour a busy answer's hint up to ``BURST_RETRIES`` times,
as the openai SDK does (``retry-after-ms``, then ``Retry-After``, then the SSE fallback's
``retry_after_ms``), counting their tries in ``x-stainless-retry-count`` as it does. A user's
TTFT counts from their first attempt; "within SLO" is the sidecar's own objectives (TTFT <= 2 s,
TPOT <= 100 ms). The same burst goes:

- straight at the engine (``alone``);
- through a fresh ``sidecar serve`` (its defaults: only the upstream and the ports are set);
- through one that served ``LIGHT_STREAMS`` streams ``BURST_IDLE_S`` earlier (``light``);
- through one that took the same burst ``BURST_IDLE_S`` earlier (``after-burst``);
- through one that served light use ``BURST_LONG_IDLE_S`` earlier (``long-idle``).

Every case runs in front of one engine, started once: a real vLLM on CPU (the tiny Llama of
``make test-vllm``, ``--max-model-len 1024``, 16 MiB of KV: 16 full-length requests, its compute
on a core of its own) and the GPU-shaped emulated engine of ``make bench-overload``. Repetitions
interleave the cases. Writes .bench/burst.json (every user) and .bench/burst.md.

    BURST_ENGINES       vllm,gpu (default both)
    BURST_CASES         alone,fresh,light,after-burst,long-idle
    BURST_REPETITIONS   default 3
    BURST_CLIENTS       default 96
    BURST_IDLE_S        default 40
    BURST_LONG_IDLE_S   default 120
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.overload import servers
from benchmarks.overload.load import STOP_TOKEN_IDS, WORDS
from benchmarks.overload.plan import GPU_ENGINE_FLAGS, GPU_MODEL
from demo.slo import quantile

ENGINES = tuple(os.environ.get("BURST_ENGINES", "vllm,gpu").split(","))
CASES = tuple(os.environ.get("BURST_CASES", "alone,fresh,light,after-burst,long-idle").split(","))
REPETITIONS = int(os.environ.get("BURST_REPETITIONS", "3"))
CLIENTS = int(os.environ.get("BURST_CLIENTS", "96"))
IDLE_S = float(os.environ.get("BURST_IDLE_S", "40"))
LONG_IDLE_S = float(os.environ.get("BURST_LONG_IDLE_S", "120"))
RETRIES = int(os.environ.get("BURST_RETRIES", "8"))
LIGHT_STREAMS = 3
TTFT_S, TPOT_S = 2.0, 0.1
VLLM_KV_BYTES = 16 * 1024 * 1024  # 16,384 tokens of the tiny model: 16 full-length requests
VLLM_MAX_MODEL_LEN = 1024
GPU_PROMPT_WORDS = 2000
OUT = Path(".bench")


@dataclass(frozen=True, slots=True, kw_only=True)
class User:
    """One user's request as they felt it: every attempt until served or given up."""

    attempts: int  # requests sent (1: served or refused at the first try)
    busy: int  # busy answers received
    served: bool
    ttft_s: float | None = None  # from the first attempt
    tpot_s: float | None = None
    tokens: int = 0
    busy_s: tuple[float, ...]  # time to each busy answer
    hints_s: tuple[float, ...]  # each busy answer's hint

    def within_slo(self) -> bool:
        return (
            self.served
            and self.ttft_s is not None
            and self.ttft_s <= TTFT_S
            and (self.tpot_s or 0.0) <= TPOT_S
        )


def _hint_s(headers: Mapping[str, str] | None, payload: dict[str, Any]) -> float:
    """The busy answer's hint, as the openai SDK reads it (1 s where none is given)."""
    if headers is not None:
        if (ms := headers.get("retry-after-ms")) is not None:
            return float(ms) / 1000
        if (seconds := headers.get("Retry-After")) is not None:
            return float(seconds)
    error = payload.get("error")
    if isinstance(error, dict) and error.get("retry_after_ms") is not None:
        return float(error["retry_after_ms"]) / 1000
    return 1.0


def body(
    model: str, prompt_words: int, rng: random.Random, max_tokens: int | None = None
) -> dict[str, object]:
    """A streaming chat of ``prompt_words`` random words; without ``max_tokens`` unless given."""
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    return {
        **extra,
        "model": model,
        "messages": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=prompt_words))}],
        "temperature": 1.0,
        "stream": True,
        "stop_token_ids": STOP_TOKEN_IDS,
        "stream_options": {"include_usage": True},
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One request's ending: ``served`` (first and last token at, tokens), ``busy`` (the
    answer's hint) or ``error``."""

    kind: str
    first_at: float | None = None
    last_at: float | None = None
    tokens: int = 0
    hint_s: float = 1.0


async def _attempt(
    session: aiohttp.ClientSession, url: str, request: dict[str, object], retries: int = 0
) -> Attempt:
    # The tries before this one, as the openai SDKs count them on every request they send.
    headers = {"x-stainless-retry-count": str(retries)}
    url += "/v1/chat/completions"
    async with session.post(url, json=request, headers=headers) as response:
        if response.status in (429, 503):
            return Attempt(kind="busy", hint_s=_hint_s(response.headers, await response.json()))
        if response.status != 200:
            return Attempt(kind="error")
        first = last = None
        tokens = 0
        event = ""
        async for raw in response.content:
            line = raw.strip()
            if line.startswith(b"event:"):
                event = line[6:].strip().decode()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if event == "fallback" or "error" in chunk:
                return Attempt(kind="busy", hint_s=_hint_s(None, chunk))
            if chunk.get("usage"):
                tokens = int(chunk["usage"].get("completion_tokens") or 0)
            choice = (chunk.get("choices") or [{}])[0]
            # A completion whose first token ends it carries no text, only its finish_reason.
            if choice.get("delta", {}).get("content") or choice.get("finish_reason"):
                last = time.monotonic()
                first = first or last
        return Attempt(kind="served", first_at=first, last_at=last, tokens=tokens)


async def one_user(
    session: aiohttp.ClientSession, url: str, request: dict[str, object], retries: int = RETRIES
) -> User:
    """One user's request, sent again after each busy answer's hint, up to ``retries`` times
    (0: an open-loop arrival, which does not come back)."""
    start = time.monotonic()
    busy_s: list[float] = []
    hints: list[float] = []
    for attempt in range(1, retries + 2):
        sent = time.monotonic()
        try:
            got = await _attempt(session, url, request, attempt - 1)
        except (aiohttp.ClientError, TimeoutError):
            got = Attempt(kind="error")
        first, last = got.first_at, got.last_at
        if got.kind == "served" and first is not None and last is not None:
            return User(
                attempts=attempt,
                busy=len(busy_s),
                served=True,
                ttft_s=first - start,
                tpot_s=(last - first) / (got.tokens - 1) if got.tokens > 1 else 0.0,
                tokens=got.tokens,
                busy_s=(*busy_s,),
                hints_s=(*hints,),
            )
        if got.kind != "busy":
            break
        # The last busy answer counts too, though the user does not come back after it.
        busy_s.append(time.monotonic() - sent)
        hints.append(got.hint_s)
        if attempt > retries:
            break
        await asyncio.sleep(got.hint_s)
    return User(
        attempts=attempt, busy=len(busy_s), served=False, busy_s=(*busy_s,), hints_s=(*hints,)
    )


async def burst(url: str, model: str, prompt_words: int, clients: int, seed: int) -> list[User]:
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        bodies = [body(model, prompt_words, rng) for _ in range(clients)]
        return list(await asyncio.gather(*(one_user(session, url, b) for b in bodies)))


def summary(users: list[User]) -> dict[str, float]:
    """The figures of one burst."""
    returns = sum(u.attempts - 1 for u in users)
    admitted_returns = sum(1 for u in users if u.served and u.attempts > 1)
    ttfts = [u.ttft_s for u in users if u.ttft_s is not None]
    busy = [s for u in users for s in u.busy_s]
    hints = [h for u in users for h in u.hints_s]
    return {
        "users": len(users),
        "first_try": sum(1 for u in users if u.served and u.attempts == 1),
        "never_served": sum(1 for u in users if not u.served),
        "busy": sum(u.busy for u in users),
        "returns": returns,
        "returns_admitted": admitted_returns / returns if returns else float("nan"),
        "ttft_p50": quantile(ttfts, 0.5),
        "ttft_p90": quantile(ttfts, 0.9),
        "within_slo": sum(1 for u in users if u.within_slo()),
        "busy_p50": quantile(busy, 0.5),
        "hint_min": min(hints, default=math.nan),
        "hint_max": max(hints, default=math.nan),
    }


@contextlib.contextmanager
def engine(name: str, logs: Path) -> Iterator[tuple[str, str, int]]:
    """The engine, started once: (its URL, the model name, prompt words)."""
    if name == "vllm":
        servers.KV_CACHE_BYTES = VLLM_KV_BYTES
        servers.MAX_MODEL_LEN = VLLM_MAX_MODEL_LEN
        with servers.vllm((), logs / "vllm.log") as url:
            yield url, servers.SERVED_MODEL, 8
    else:
        with servers.emulator(GPU_ENGINE_FLAGS, logs / "emulator.log") as url:
            yield url, GPU_MODEL, GPU_PROMPT_WORDS


async def run_case(
    case: str, engine_at: tuple[str, str, int], *, seed: int, logs: Path
) -> list[User]:
    """One case: its history, then the measured burst."""
    url, model, words = engine_at
    if case == "alone":
        return await burst(url, model, words, CLIENTS, seed)
    with servers.sidecar(url, None, logs / f"sidecar-{case}.log") as front:
        if case in ("light", "long-idle"):
            await burst(front, model, words, LIGHT_STREAMS, seed + 1000)
        elif case == "after-burst":
            await burst(front, model, words, CLIENTS, seed + 1000)
        if case != "fresh":
            await asyncio.sleep(LONG_IDLE_S if case == "long-idle" else IDLE_S)
        return await burst(front, model, words, CLIENTS, seed)


def main() -> int:
    servers.pin_clients()
    OUT.mkdir(exist_ok=True)
    logs = OUT / "burst-logs"
    logs.mkdir(exist_ok=True)
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    users: dict[str, list[dict[str, object]]] = {}
    for name in ENGINES:
        with engine(name, logs) as engine_at:
            asyncio.run(burst(*engine_at, 4, 0))  # the engine's own warm-up
            for rep in range(REPETITIONS):
                for case in CASES:
                    got = asyncio.run(run_case(case, engine_at, seed=100 * rep, logs=logs))
                    figures = summary(got)
                    results.setdefault(name, {}).setdefault(case, []).append(figures)
                    users[f"{name}/{case}/{rep}"] = [asdict(u) for u in got]
                    print(f"{name} {case} rep {rep}: {json.dumps(figures)}", flush=True)
    (OUT / "burst.json").write_text(json.dumps({"results": results, "users": users}))
    report = render(results)
    (OUT / "burst.md").write_text(report)
    print(report)
    return 0


def render(results: dict[str, dict[str, list[dict[str, float]]]]) -> str:
    """A table per engine: median of the repetitions, worst repetition's within-SLO beside it."""
    lines = []
    for name, cases in results.items():
        alone = statistics.median(f["within_slo"] for f in cases.get("alone", [{"within_slo": 0}]))
        lines += [
            f"\n{name}: {CLIENTS} users, median of {REPETITIONS} (worst in brackets)\n",
            "| case | 1st try | never served | busy | returns admitted | user TTFT p50 / p90 s "
            "| within SLO | vs alone | busy p50 s | hints s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for case, reps in cases.items():
            med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
            worst = min(r["within_slo"] for r in reps)
            ratio = med["within_slo"] / alone if alone else float("nan")
            cells = (
                case,
                f"{med['first_try']:.0f}",
                f"{med['never_served']:.0f}",
                f"{med['busy']:.0f}",
                f"{med['returns_admitted']:.0%}",
                f"{med['ttft_p50']:.2f} / {med['ttft_p90']:.2f}",
                f"{med['within_slo']:.0f} ({worst:.0f})",
                f"{ratio:.2f}x",
                f"{med['busy_p50']:.3f}",
                f"{med['hint_min']:.1f}-{med['hint_max']:.1f}",
            )
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
