"""The work done before admission: reading the body (bounded in size, time and pace), then checking
it and, where configured, counting its prompt at the engine. Only the checking and the counting run
inside the edge's Gate: a body is awaited outside it, so a client that never sends one holds its
own connection and nothing else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from multidict import CIMultiDict

from sidecar.core.admission.room_hint import RoomHint
from sidecar.core.errors import EdgeRefusedError, RequestError
from sidecar.core.request.json_body import parse_object
from sidecar.core.request.prompt_estimate import estimate_prompt
from sidecar.core.request.request_checks import (
    CheckedRequest,
    Endpoint,
    TokenPolicy,
    check_request,
    enforce_prompt_budget,
    template_unpriced,
    with_prompt_tokens,
)
from sidecar.edge.http.request import Request
from sidecar.edge.message import charset_of
from sidecar.edge.proxy.prompt_count import EnginePromptCounter
from sidecar.edge.proxy.routes import Target


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A request read and priced, ready for admission."""

    target: Target
    body: bytes | None
    flat_cost: int  # what a request without a token budget costs; a checked one is priced later
    stream: bool  # streaming completion: busy answers are SSE
    whole_answer: bool  # a non-streaming completion: read the engine's answer whole
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    checked: CheckedRequest | None = None  # a completion's checks, for adaptive pricing
    headers: CIMultiDict[str] | None = None  # what goes to the engine, where already built


async def read_body(request: Request, limits: BodyLimits) -> bytes:
    """The whole body, within the size limit, ``limits.timeout_s`` and the floor on its recent
    pace (a sliding window, up to where its connection's rest began, if it rests: what its
    client sent since waits for us, not for it); RequestError, or EdgeRefusedError
    ``body_timeout`` (408) when it is too late or too slow."""
    expect = request.headers.get("Expect")
    if expect is not None:
        _check_expectation(expect)
    if request.complete or request.fault is not None:  # read() cannot wait: no timer
        return await request.read()
    # Only now, once the request was routed and checked, so a refused one never makes its
    # client send the body.
    if expect is not None and request.version >= (1, 1):
        request.send_continue()
    loop = asyncio.get_running_loop()
    started = loop.time()
    pace: BodyPace | None = limits.first_check(started)
    while pace is not None:
        try:
            async with asyncio.timeout_at(pace.check_at):
                return await request.read()
        except TimeoutError:
            rested_s = request.wire.rested_s()
            pace = limits.check(pace, started, loop.time(), request.received, rested_s=rested_s)
    raise EdgeRefusedError("body_timeout")


def _check_expectation(expect: str) -> None:
    if expect.strip().lower() != "100-continue":  # never echoed: it is the client's text
        raise RequestError(
            "the only expectation this server meets is Expect: 100-continue",
            status=417,
            code="expectation_failed",
        )


def require_json(request: Request) -> None:
    """A priced request's body must be UTF-8 JSON: a declared other charset is a 415.

    The media type itself is not enforced (``curl -d`` sends a form type with a JSON body); the
    bytes are: check_request refuses any body that is not UTF-8 JSON.
    """
    charset = charset_of(request.headers.get("Content-Type"))
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        raise RequestError(
            "the request body must be JSON in UTF-8 (Content-Type: application/json)",
            status=415,
            code="unsupported_media_type",
        )


# An estimate past this many times the prompt budget is refused without asking the engine: to
# fit, its text would need 4 x SIDECAR_PROMPT_BYTES_PER_TOKEN bytes a token (16 by default), which
# no tokenizer averages on text (a 4 MiB prompt against a 3,000-token budget never costs a count).
DECISIVELY_OVER = 4


async def checked_request(
    body: bytes,
    endpoint: Endpoint,
    budget: TokenPolicy,
    *,
    counter: EnginePromptCounter | None,
    headers: Mapping[str, str],
    client: str = "",
) -> CheckedRequest:
    """The body, validated and budgeted; its prompt counted by the engine where configured,
    unless its estimate is decisively over the budget already."""
    checked = check_request(body, endpoint, budget)
    if checked.tokenize is None or counter is None:
        return checked
    estimate = _estimate(checked, body, endpoint, budget)
    if estimate > DECISIVELY_OVER * budget.max_prompt_tokens:
        enforce_prompt_budget(estimate, checked.prompt_param, budget)
    tokens = await counter.count(checked.tokenize, headers, client)
    if tokens is None:  # the engine could not say: the estimate prices it, and bounds it
        if "chat_template" in checked.tokenize:
            raise template_unpriced()  # which no estimate can
        enforce_prompt_budget(checked.prompt_tokens, checked.prompt_param, budget)
        return checked
    return with_prompt_tokens(checked, tokens, budget)


def _estimate(checked: CheckedRequest, body: bytes, endpoint: Endpoint, budget: TokenPolicy) -> int:
    """The prompt's estimate; where it was priced at the engine's context (no sequence runs
    past it), the estimate before that bound, which says how far over the budget it is."""
    context = budget.context_tokens
    if context is None or checked.prompt_tokens < context:
        return checked.prompt_tokens
    return estimate_prompt(parse_object(body), endpoint, budget.rates)[0]


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """How long a request body may take: ``timeout_s`` in all, and never less than ``min_rate``
    bytes a second over the last ``grace_s`` (0: no floor). The floor is what keeps a client from
    holding a connection with a trickle (Apache's mod_reqtimeout has the same pair: a timeout and
    a MinRate). It is the recent pace, over a window that slides by half its length, not the
    average since the start: a fast start cannot buy a stall that lasts until the timeout."""

    timeout_s: float = 30.0
    min_rate: int = 500
    grace_s: float = 5.0

    def first_check(self, started: float) -> BodyPace:
        """The pace to keep for a body that began at ``started``: first checked after the
        grace (a whole window), then every half window."""
        return BodyPace(((started, 0),), self._next(started, started + self.grace_s))

    def check(
        self, pace: BodyPace, started: float, now: float, received: int, *, rested_s: float = 0.0
    ) -> BodyPace | None:
        """At ``pace.check_at``: the pace to keep next, or None where the body is too late or
        received less than the floor over the window that ends now, or where its connection's
        rest began, ``rested_s`` ago: the sidecar stopped reading then, not the client sending
        (the read floor's rest: ``received`` has not moved since)."""
        if now >= started + self.timeout_s:
            return None
        seen = now - rested_s
        window_start = seen - self.grace_s
        # The window's base: the last mark at or before its start (the body's start at first).
        base = next((m for m in reversed(pace.marks) if m[0] <= window_start), pace.marks[0])
        since, then = base
        if self.min_rate > 0 and received - then < self.min_rate * (seen - since):
            return None
        marks = (*(m for m in pace.marks if m[0] >= since), (seen, received))
        return BodyPace(marks, self._next(started, now + self.grace_s / 2))

    def _next(self, started: float, at: float) -> float:
        deadline = started + self.timeout_s
        return deadline if self.min_rate <= 0 else min(deadline, at)


@dataclass(frozen=True, slots=True)
class BodyPace:
    """A body's pace so far: (time, bytes received) at each check of the last window, oldest
    first, and when it is checked next."""

    marks: tuple[tuple[float, int], ...]
    check_at: float


class Gate:
    """At most ``limit`` requests being parsed, checked or counted at once (``with gate:``); the
    next one is refused at once (503 ``edge_busy``), never queued."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._limit = limit
        self.held = 0
        self.refused = 0
        self._clock = clock
        self._room = RoomHint(clock())  # when a holder goes, for a refusal's Retry-After

    def __enter__(self) -> None:
        if self.held >= self._limit:
            self.refused += 1
            raise EdgeRefusedError("edge_busy", self._room.wait_s(self._clock()))
        self.held += 1

    def __exit__(self, *_exc: object) -> None:
        self.held -= 1
        self._room.freed(self._clock())
