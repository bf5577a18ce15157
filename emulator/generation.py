"""The /v1/chat/completions and /v1/completions handlers: streaming, non-streaming, faults."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiohttp import web

from emulator import sse, tokens
from emulator.config import EmulatorConfig
from emulator.faults import HEADER, Fault, parse_fault
from emulator.queue_cap import QUEUE_FULL_MESSAGE, QUEUE_FULL_TYPE, QueueCap
from emulator.requests import Generation, InvalidRequestError, Kind, parse_generation
from emulator.runner import ClientGoneError, EngineRunner, KVCacheExhaustedError, Pacing

log = structlog.get_logger("emulator")

_STATUS_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError"}
_OOM_MESSAGE = "CUDA out of memory: the KV cache is exhausted (emulated, --oom mode)"


@dataclass(frozen=True)
class Job:
    """Everything one generation needs besides the HTTP objects."""

    generation: Generation
    fault: Fault
    stream: sse.Stream
    seed: int
    length: int  # the tokens this completion really produces (<= max_tokens)

    @property
    def finish_reason(self) -> str:
        return "length" if self.length >= self.generation.max_tokens else "stop"


class GenerationHandler:
    """Serves one of the two OpenAI generation endpoints from an ``EngineRunner``."""

    def __init__(
        self,
        kind: Kind,
        config: EmulatorConfig,
        runner: EngineRunner,
        clock: Callable[[], float],
        poll_s: float = 0.05,
        *,
        lengths: Callable[[int], int] = lambda max_tokens: max_tokens,
        queue_cap: QueueCap | None = None,
    ) -> None:
        self._lengths = lengths
        self._queue_cap = queue_cap or QueueCap(None)
        self._kind = kind
        self._config = config
        self._runner = runner
        self._clock = clock
        self._poll_s = poll_s

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Validate, apply a status fault, then stream or answer in one JSON body."""
        try:
            job = self._job(request, await request.json())
        except json.JSONDecodeError:
            return error_response(400, "request body is not valid JSON")
        except InvalidRequestError as exc:
            return error_response(exc.status, exc.message, exc.param)
        if job.fault.status is not None:
            return error_response(job.fault.status, f"injected fault: status {job.fault.status}")
        if not self._queue_cap.admit():
            return error_response(503, QUEUE_FULL_MESSAGE, error_type=QUEUE_FULL_TYPE)
        try:
            if job.generation.stream:
                return await self._stream(request, job)
            return await self._complete(request, job)
        finally:
            self._queue_cap.release()

    def _job(self, request: web.Request, body: object) -> Job:
        generation = parse_generation(body, self._kind, self._config)
        try:
            fault = parse_fault(request.headers.get(HEADER))
        except ValueError as exc:
            raise InvalidRequestError(str(exc), param=HEADER) from exc
        prefix = "chatcmpl-" if self._kind == "chat" else "cmpl-"
        stream = sse.Stream(
            self._kind, prefix + uuid.uuid4().hex[:16], int(self._clock()), self._config.model_name
        )
        length = self._lengths(generation.max_tokens)
        return Job(generation, fault, stream, tokens.seed_of(generation.prompt), length)

    def _pacing(self, fault: Fault) -> Pacing:
        hang_after = None if fault.stall_after is None else fault.stall_after + 1
        return Pacing(self._config.ttft_s + fault.slow_first_token_s, hang_after)

    async def _stream(self, request: web.Request, job: Job) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        gen, fault = job.generation, job.fault
        tokens_out = self._runner.generate(
            job.stream.id, gen.prompt_tokens, job.length, self._pacing(fault), _alive(request)
        )
        try:
            async with contextlib.aclosing(tokens_out):
                async for index in tokens_out:
                    if not response.prepared:
                        await self._open(request, response, job.stream)
                    if index in (fault.reset_after, fault.stall_after):
                        return await self._break(request, response, fault, index)
                    await response.write(_token_chunk(job, index))
        except KVCacheExhaustedError:
            log.warning("emulator_kv_oom", request_id=job.stream.id)
            if not response.prepared:
                return error_response(500, _OOM_MESSAGE, error_type="InternalServerError")
            tail = [sse.error_chunk(_OOM_MESSAGE, "InternalServerError", 500)]
        except (ConnectionResetError, ClientGoneError):  # gone while streaming, or while queued
            # The generator was closed on the way out, so the blocks are already free.
            log.info("emulator_client_gone", request_id=job.stream.id)
            return response
        else:
            usage = sse.usage_chunk(job.stream, gen.prompt_tokens, job.length)
            tail = [usage] if gen.include_usage else []
        return await _end(response, job, [*tail, sse.DONE])

    async def _open(
        self, request: web.Request, response: web.StreamResponse, stream: sse.Stream
    ) -> None:
        # vLLM sends its headers with the first chunk, after the queue wait and the TTFT.
        await response.prepare(request)
        if stream.kind == "chat":
            await response.write(sse.role_chunk(stream))

    async def _break(
        self, request: web.Request, response: web.StreamResponse, fault: Fault, index: int
    ) -> web.StreamResponse:
        log.info("emulator_fault", fault="reset" if index == fault.reset_after else "stall")
        if index == fault.reset_after:
            if request.transport is not None:
                request.transport.abort()
            return response
        # A stalled engine keeps the request (and its blocks) until the client gives up.
        alive = _alive(request)
        while alive():  # noqa: ASYNC110 - aiohttp offers no event for "the peer closed"
            await asyncio.sleep(self._poll_s)
        return response

    async def _complete(self, request: web.Request, job: Job) -> web.StreamResponse:
        gen = job.generation
        pieces: list[str] = []
        tokens_out = self._runner.generate(
            job.stream.id,
            gen.prompt_tokens,
            job.length,
            self._pacing(job.fault),
            _alive(request),
        )
        try:
            async with contextlib.aclosing(tokens_out):
                async for index in tokens_out:
                    pieces.append(tokens.piece(job.seed, index))
        except KVCacheExhaustedError:
            return error_response(500, _OOM_MESSAGE, error_type="InternalServerError")
        body = sse.completion_body(
            job.stream, "".join(pieces), job.finish_reason, gen.prompt_tokens, len(pieces)
        )
        return web.json_response(body)


def error_response(
    status: int, message: str, param: str | None = None, error_type: str | None = None
) -> web.Response:
    """An OpenAI-shaped error, as vLLM answers before a stream starts."""
    kind = error_type or _STATUS_TYPES.get(status, "ServiceUnavailableError")
    return web.json_response(sse.error_body(message, kind, status, param), status=status)


async def _end(response: web.StreamResponse, job: Job, chunks: list[bytes]) -> web.StreamResponse:
    """The stream's last chunks; a client gone by then is an outcome, not a handler error."""
    try:
        for chunk in chunks:
            await response.write(chunk)
        await response.write_eof()
    except ConnectionResetError:
        log.info("emulator_client_gone", request_id=job.stream.id)
    return response


def _token_chunk(job: Job, index: int) -> bytes:
    gen = job.generation
    final = index == job.length - 1
    text = tokens.piece(job.seed, index)
    last = final and not gen.include_usage
    return sse.token_chunk(job.stream, text, job.finish_reason if final else None, last=last)


def _alive(request: web.Request) -> Callable[[], bool]:
    def alive() -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()

    return alive
