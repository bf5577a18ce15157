"""The overload's clients: streaming completions with hidden lengths, closed-loop or open-loop.

Each request asks for ``max_tokens`` and ends at one of ``STOP_TOKEN_IDS`` (temperature 1), so
nobody can read its length from the request (a per-request ``seed`` would make it repeatable,
but crashes vLLM's CPU build). A client sees one of three endings: completed (the stream reached
``[DONE]``), busy (429 or 503, an in-band error of code 503, or an SSE ``fallback`` event) or an
error. Every request becomes a ``Record``; the report counts those that end inside the window.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from demo.slo import Ending, Record

# 16 ids of the tiny model's 4,096: about 1 token in 256 ends a completion.
STOP_TOKEN_IDS = list(range(1000, 1016))
WORDS = (
    "river", "stone", "cloud", "market", "engine", "paper", "garden", "window", "silver",
    "orange", "number", "letter", "forest", "signal", "bridge", "yellow", "winter", "summer",
    "castle", "planet", "rocket", "pencil", "simple", "better", "system",
)  # fmt: skip
# The tiny model's tokenizer makes about 3.4 tokens of one of these words (2 bytes a token).
SHORT_WORDS = 8  # about 30 tokens
LONG_WORDS = 118  # about 400 tokens: a preemption's recompute costs real engine time
# After a busy answer: the server's Retry-After, at most 1 s; without one, the openai SDK's
# first retry delay.
DEFAULT_BACKOFF_S = 0.5
MAX_BACKOFF_S = 1.0


@dataclass(frozen=True, slots=True)
class Load:
    """One load shape: closed-loop ``clients``, or open-loop Poisson at ``rate`` per second."""

    name: str
    prompt_words: int
    clients: int = 0
    rate: float = 0.0
    max_tokens: int = 1024
    stop_token_ids: tuple[int, ...] = tuple(STOP_TOKEN_IDS)


@dataclass(slots=True)
class Tally:
    """Every request the clients sent: when (also those still running at the end), and each
    that ended as a record, in the order they ended."""

    sent: list[float] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)


@dataclass(slots=True)
class Window:
    """The measurement window on the monotonic clock."""

    start: float
    end: float

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end


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
        "stop_token_ids": list(load.stop_token_ids),
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
) -> Record:
    """Send one streaming completion and record how it ended."""
    sent = time.monotonic()
    body = _body(load, model, rng)
    try:
        async with session.post(url + "/v1/completions", json=body) as response:
            if response.status in (429, 503):
                await response.read()
                hint = _retry_after(response.headers)
                return Record("busy", sent, time.monotonic(), retry_after_s=hint)
            if response.status != 200:
                text = (await response.read())[:80].decode(errors="replace")
                return Record("error", sent, time.monotonic(), detail=f"{response.status} {text}")
            return await _read_stream(response, sent)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Record("error", sent, time.monotonic(), detail=type(exc).__name__)


async def _read_stream(response: aiohttp.ClientResponse, sent: float) -> Record:
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
            return Record("completed", sent, time.monotonic(), ttft, tokens or events)
        chunk = json.loads(data)
        if event_name == "fallback":
            hint = chunk.get("error", {}).get("retry_after_ms")
            return Record(
                "busy", sent, time.monotonic(), retry_after_s=None if hint is None else hint / 1000
            )
        if "error" in chunk:
            # vLLM's own queue caps answer a stream that passed their first check with 200 and
            # an in-band error of code 503.
            code = chunk["error"].get("code")
            ending: Ending = "busy" if code in (429, 503, "429", "503") else "error"
            return Record(ending, sent, time.monotonic(), detail=str(code))
        if chunk.get("usage"):
            tokens = int(chunk["usage"].get("completion_tokens") or 0)
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            events += 1
            if ttft is None:
                ttft = time.monotonic() - sent
    return Record("error", sent, time.monotonic(), detail="truncated")


def backoff_s(record: Record) -> float:
    """What a client waits after a busy answer: the server's hint (capped), else a constant."""
    if record.retry_after_s is not None and record.retry_after_s > 0:
        return min(record.retry_after_s, MAX_BACKOFF_S)
    return DEFAULT_BACKOFF_S


def _session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


async def closed_loop(
    url: str, load: Load, model: str, window: Window, tally: Tally, *, seed: int = 7
) -> None:
    """``load.clients`` clients, each sending its next request as soon as the last one ended
    (after a busy answer or an error, once it has waited ``backoff_s``)."""
    rng = random.Random(seed)
    async with _session() as session:

        async def client(index: int) -> None:
            await asyncio.sleep(index * 0.01)  # a ramp over a second, not one instant
            while time.monotonic() < window.end:
                tally.sent.append(time.monotonic())
                record = await one_request(session, url, load, model, rng)
                tally.records.append(record)
                if record.ending != "completed":
                    await asyncio.sleep(backoff_s(record))

        await asyncio.gather(*(client(i) for i in range(load.clients)))


# Sends one request and records how it ended (``one_request``; a test gives its own).
Send = Callable[[aiohttp.ClientSession, str, Load, str, random.Random], Awaitable[Record]]


async def open_loop(
    url: str,
    load: Load,
    model: str,
    window: Window,
    tally: Tally,
    *,
    seed: int = 7,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    send: Send = one_request,
) -> None:
    """Poisson arrivals at ``load.rate`` per second until the window ends; nobody retries.

    Arrivals keep a schedule of their own (its own random stream, so one seed gives one
    schedule): a loop that wakes late, busy relaying streams, starts every arrival already due
    at once, so the load offers ``load.rate`` however busy the client is. The tally's ``sent``
    holds each arrival's scheduled time (what was offered); its record's ``sent_at`` is when the
    request really went out, and its TTFT counts from there."""
    arrivals, bodies = random.Random(seed), random.Random(seed + 1)
    pending: set[asyncio.Task[None]] = set()
    async with _session() as session:

        async def one() -> None:
            tally.records.append(await send(session, url, load, model, bodies))

        try:
            due = clock()
            while due < window.end:
                while due <= clock() and due < window.end:
                    tally.sent.append(due)
                    task = asyncio.create_task(one())
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    due += arrivals.expovariate(load.rate)
                await sleep(max(0.0, min(due, window.end) - clock()))
        finally:
            # Requests still running when the window closes cannot count: stop them.
            for task in list(pending):
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
