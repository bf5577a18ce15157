"""The overload's clients: streaming completions with hidden lengths, closed-loop or open-loop.

Each request asks for ``max_tokens`` and ends at one of ``STOP_TOKEN_IDS`` (temperature 1), so
nobody can read its length from the request. A client sees one of three endings: completed (the
stream reached ``[DONE]``), busy (429 or 503, or an SSE ``fallback`` event) or an error. Only what
ends inside the measurement window counts.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

# 16 ids of the tiny model's 4,096: about 1 token in 256 ends a completion.
STOP_TOKEN_IDS = list(range(1000, 1016))
WORDS = (
    "river", "stone", "cloud", "market", "engine", "paper", "garden", "window", "silver",
    "orange", "number", "letter", "forest", "signal", "bridge", "yellow", "winter", "summer",
    "castle", "planet", "rocket", "pencil", "simple", "better", "system",
)  # fmt: skip
# The tiny model's tokenizer makes about 3.4 tokens of one of these words (2 bytes a token).
SHORT_WORDS = 8  # about 30 tokens
LONG_WORDS = 150  # about 510 tokens: a preemption's recompute costs real engine time
DEFAULT_BACKOFF_S = 0.5
MAX_BACKOFF_S = 2.0

Ending = Literal["completed", "busy", "error"]


@dataclass(frozen=True, slots=True)
class Load:
    """One load shape: closed-loop ``clients``, or open-loop Poisson at ``rate`` per second."""

    name: str
    prompt_words: int
    clients: int = 0
    rate: float = 0.0
    max_tokens: int = 1024


@dataclass(slots=True)
class Tally:
    """What the clients saw, per request that ended inside the window."""

    completed: int = 0
    tokens: int = 0
    sent: int = 0  # requests sent inside the window (open loop: what it managed to offer)
    busy: int = 0
    errors: int = 0
    ttft_s: list[float] = field(default_factory=list)
    busy_s: list[float] = field(default_factory=list)
    error_kinds: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Window:
    """The measurement window on the monotonic clock."""

    start: float
    end: float

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True, slots=True)
class Result:
    ending: Ending
    ended_at: float
    ttft_s: float | None = None
    tokens: int = 0
    elapsed_s: float = 0.0
    retry_after_s: float | None = None
    detail: str = ""


def prompt(words: int, rng: random.Random) -> str:
    """Random words: no two prompts share a prefix the engine could cache."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _body(load: Load, model: str, rng: random.Random) -> dict[str, object]:
    return {
        "model": model,
        "prompt": prompt(load.prompt_words, rng),
        "max_tokens": load.max_tokens,
        "temperature": 1.0,
        "stream": True,
        "stop_token_ids": STOP_TOKEN_IDS,
        "stream_options": {"include_usage": True},
    }


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The server's hint: ``retry-after-ms`` first, then ``Retry-After``, as the openai SDK."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        return float(ms) / 1000
    seconds = headers.get("Retry-After")
    return float(seconds) if seconds is not None else None


async def one_request(
    session: aiohttp.ClientSession, url: str, load: Load, model: str, rng: random.Random
) -> Result:
    """Send one streaming completion and say how it ended."""
    sent = time.monotonic()
    body = _body(load, model, rng)
    try:
        async with session.post(url + "/v1/completions", json=body) as response:
            if response.status in (429, 503):
                await response.read()
                return Result("busy", time.monotonic(), elapsed_s=time.monotonic() - sent,
                              retry_after_s=_retry_after(response.headers))  # fmt: skip
            if response.status != 200:
                text = (await response.read())[:80].decode(errors="replace")
                return Result("error", time.monotonic(), detail=f"{response.status} {text}")
            return await _read_stream(response, sent)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Result("error", time.monotonic(), detail=type(exc).__name__)


async def _read_stream(response: aiohttp.ClientResponse, sent: float) -> Result:
    ttft: float | None = None
    tokens = events = 0
    event_name = ""
    async for raw in response.content:
        line = raw.strip()
        if line.startswith(b"event:"):
            event_name = line[6:].strip().decode()
            continue
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            now = time.monotonic()
            return Result("completed", now, ttft, tokens or events, now - sent)
        chunk = json.loads(data)
        if event_name == "fallback":
            now = time.monotonic()
            hint = chunk.get("error", {}).get("retry_after_ms")
            return Result("busy", now, elapsed_s=now - sent,
                          retry_after_s=None if hint is None else hint / 1000)  # fmt: skip
        if "error" in chunk:
            # vLLM's own queue caps answer a stream with 200 and an in-band error of code 503.
            code = chunk["error"].get("code")
            now = time.monotonic()
            if code in (429, 503, "429", "503"):
                return Result("busy", now, elapsed_s=now - sent)
            return Result("error", now, detail=str(code))
        if chunk.get("usage"):
            tokens = int(chunk["usage"].get("completion_tokens") or 0)
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            events += 1
            if ttft is None:
                ttft = time.monotonic() - sent
    return Result("error", time.monotonic(), detail="truncated")


def record(tally: Tally, result: Result, window: Window) -> None:
    """Count ``result`` if it ended inside the window."""
    if not window.holds(result.ended_at):
        return
    if result.ending == "completed":
        tally.completed += 1
        tally.tokens += result.tokens
        if result.ttft_s is not None:
            tally.ttft_s.append(result.ttft_s)
    elif result.ending == "busy":
        tally.busy += 1
        tally.busy_s.append(result.elapsed_s)
    else:
        tally.errors += 1
        tally.error_kinds[result.detail] = tally.error_kinds.get(result.detail, 0) + 1


def backoff_s(result: Result) -> float:
    """What a client waits after a busy answer: the server's hint (capped), else a constant."""
    if result.retry_after_s is not None and result.retry_after_s > 0:
        return min(result.retry_after_s, MAX_BACKOFF_S)
    return DEFAULT_BACKOFF_S


async def closed_loop(
    url: str, load: Load, model: str, window: Window, tally: Tally, *, seed: int = 7
) -> None:
    """``load.clients`` clients, each sending its next request as soon as the last one ended."""
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client(index: int) -> None:
            await asyncio.sleep(index * 0.01)  # a ramp over a second, not one instant
            while time.monotonic() < window.end:
                tally.sent += window.holds(time.monotonic())
                result = await one_request(session, url, load, model, rng)
                record(tally, result, window)
                if result.ending != "completed":
                    await asyncio.sleep(backoff_s(result))

        await asyncio.gather(*(client(i) for i in range(load.clients)))


async def open_loop(
    url: str, load: Load, model: str, window: Window, tally: Tally, *, seed: int = 7
) -> None:
    """Poisson arrivals at ``load.rate`` per second until the window ends; nobody retries."""
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        pending: set[asyncio.Task[None]] = set()

        async def one() -> None:
            if window.holds(time.monotonic()):
                tally.sent += 1
            record(tally, await one_request(session, url, load, model, rng), window)

        while (now := time.monotonic()) < window.end:
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(rng.expovariate(load.rate))
        # Requests still running when the window closes cannot count: stop them.
        for task in list(pending):
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        del now
