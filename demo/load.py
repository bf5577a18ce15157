"""The demo's load: phases of streaming clients (the real openai SDK) that stop by themselves.

Each client loops until its phase's last start, one streaming chat completion at a time, and counts
what it saw: ``completed`` or the fallback's code (``queue_full``, ``timeout``...). A stream still
running at a deadline finishes in the next phase: nothing is cut short to change phase.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

import openai

from demo.slo import Ending, Record

COMPLETED = "completed"
ERROR = "error"
# The codes the sidecar's busy answer carries (sidecar.limiter.bulkhead's reject reasons).
FALLBACK_CODES = frozenset({"queue_full", "timeout", "too_large", "draining", "no_capacity"})

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Phase:
    """A stretch of the scenario: how many clients, for how long, and who else is on the GPU."""

    name: str
    duration_s: float
    clients: int
    neighbour_bytes: int = 0
    think_s: float = 0.0  # pause between one client's requests
    # Stop starting requests this long before the end, so the phase's streams end inside it.
    settle_s: float = 0.0


@dataclass(frozen=True)
class Request:
    """What every client asks for."""

    model: str
    max_tokens: int
    prompt: str = "Tell me about bulkheads on ships."
    label: str = ""  # how the intro describes the prompt


class Tally:
    """Outcomes and times to first token, as the clients saw them, per phase."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.by_phase: dict[str, Counter[str]] = {}
        self._ttfts: dict[str, list[float]] = {}
        self.started: Counter[str] = Counter()
        self.records: dict[str, list[Record]] = {}

    def sent(self, phase: str) -> None:
        """Count one request as it goes out."""
        self.started[phase] += 1

    def record(self, phase: str, outcome: str) -> None:
        """Count one finished request."""
        self.outcomes[outcome] += 1
        self.by_phase.setdefault(phase, Counter())[outcome] += 1

    def request(self, phase: str, record: Record) -> None:
        """Keep one finished request's record (for SLO goodput)."""
        self.records.setdefault(phase, []).append(record)

    def first_token(self, phase: str, ttft_s: float) -> None:
        """A stream's first token arrived ``ttft_s`` after its request was sent."""
        self._ttfts.setdefault(phase, []).append(ttft_s)

    @property
    def completed(self) -> int:
        """Streams that ran to the end."""
        return self.outcomes[COMPLETED]

    @property
    def fallbacks(self) -> int:
        """Requests the sidecar answered with a busy fallback."""
        return sum(n for outcome, n in self.outcomes.items() if outcome in FALLBACK_CODES)

    def p50_ttft_s(self, phase: str | None = None) -> float | None:
        """Median time to first token (queue wait included), in one phase or overall."""
        return self.ttft_quantile_s(0.5, phase)

    def ttft_quantile_s(self, q: float, phase: str | None = None) -> float | None:
        """The ``q`` quantile (0..1, nearest rank) of times to first token; None without any."""
        if phase is None:
            times = [t for ttfts in self._ttfts.values() for t in ttfts]
        else:
            times = self._ttfts.get(phase, [])
        if not times:
            return None
        if q == 0.5:
            return statistics.median(times)
        ordered = sorted(times)
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def outcome_of(exc: openai.APIError) -> str:
    """A fallback's code, or ``error`` for anything the sidecar did not decide."""
    code = exc.code if isinstance(exc.code, str) else None
    return code if code in FALLBACK_CODES else ERROR


def retry_hint_s(exc: openai.APIError) -> float | None:
    """The busy answer's retry advice, if it has one: a 429/503's ``retry-after-ms`` header (the
    SDK asks for JSON, so a refused stream is answered so), or a fallback's ``retry_after_ms``."""
    if isinstance(exc, openai.APIStatusError):
        try:
            return float(exc.response.headers["retry-after-ms"]) / 1000
        except (KeyError, ValueError):
            return None
    body = exc.body
    hint = body.get("retry_after_ms") if isinstance(body, dict) else None
    return hint / 1000 if isinstance(hint, int | float) and hint >= 0 else None


@dataclass(frozen=True)
class Answer:
    """How one request ended, when the server advised to come back (busy answers), and what a
    completed stream brought: its time to first token and its tokens (a chunk each)."""

    outcome: str
    retry_after_s: float | None = None
    ttft_s: float | None = None
    tokens: int = 0


async def one_request(
    client: openai.AsyncOpenAI,
    request: Request,
    clock: Callable[[], float],
    on_first_token: Callable[[float], None],
) -> Answer:
    """Stream one chat completion; its outcome, and its time to first token once it completed
    (a stream that fails later does not count: the TTFT shown is of completed requests)."""
    started = clock()
    first: float | None = None
    tokens = 0
    try:
        stream = await client.chat.completions.create(
            model=request.model,
            messages=[{"role": "user", "content": request.prompt}],
            max_tokens=request.max_tokens,
            stream=True,
        )
        async with stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    tokens += 1
                    if first is None:
                        first = clock() - started
    except openai.APIError as exc:
        return Answer(outcome_of(exc), retry_hint_s(exc))
    if first is not None:
        on_first_token(first)
    return Answer(COMPLETED, ttft_s=first, tokens=tokens)


class Load:
    """Runs the phases in order; ``on_phase`` hears each phase as it starts."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        request: Request,
        tally: Tally,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        backoff_s: float = 1.0,
        seed: int = 0,
    ) -> None:
        self._client, self._request, self._tally = client, request, tally
        self._clock, self._sleep, self._backoff_s = clock, sleep, backoff_s
        self._jitter = random.Random(seed)  # noqa: S311 - a load shape, not a secret

    async def run(self, phases: tuple[Phase, ...], on_phase: Callable[[Phase], None]) -> None:
        """Start each phase's clients, wait out its duration; return once every client is done."""
        async with asyncio.TaskGroup() as group:
            for phase in phases:
                on_phase(phase)
                deadline = self._clock() + max(0.0, phase.duration_s - phase.settle_s)
                for number in range(phase.clients):
                    group.create_task(
                        self._client_loop(phase, deadline), name=f"demo-{phase.name}-{number}"
                    )
                await self._sleep(phase.duration_s)

    async def _client_loop(self, phase: Phase, deadline: float) -> None:
        while self._clock() < deadline:
            self._tally.sent(phase.name)
            sent_at = self._clock()
            answer = await one_request(
                self._client,
                self._request,
                self._clock,
                partial(self._tally.first_token, phase.name),
            )
            self._tally.record(phase.name, answer.outcome)
            self._tally.request(phase.name, _record(answer, sent_at, self._clock()))
            pause = phase.think_s if answer.outcome == COMPLETED else self._backoff(answer)
            if pause > 0:
                await self._sleep(pause)

    def _backoff(self, answer: Answer) -> float:
        # A polite client backs off after a busy answer, for as long as the answer advised (at
        # least backoff_s), with jitter (0.5x..1.5x, seeded) so refused clients do not come back
        # as one wave.
        wait = max(self._backoff_s, answer.retry_after_s or 0.0)
        return wait * (0.5 + self._jitter.random())


def _record(answer: Answer, sent_at: float, ended_at: float) -> Record:
    if answer.outcome == COMPLETED:
        return Record("completed", sent_at, ended_at, answer.ttft_s, answer.tokens)
    ending: Ending = "busy" if answer.outcome in FALLBACK_CODES else "error"
    return Record(ending, sent_at, ended_at, retry_after_s=answer.retry_after_s)
