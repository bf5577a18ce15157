"""The pure model of a paged engine's scheduler: a KV block pool, a waiting queue, engine steps.

No clock, no I/O. Each ``step()`` is one forward pass of the engine, scheduled the way vLLM V1
does it (vllm/v1/core/sched/scheduler.py, ``Scheduler.schedule``): every request has a number of
tokens (prompt + generated) and a number already computed into its KV blocks; a step gives each
running request, then waiting ones, the tokens it lacks, within a per-step token budget
(``max_num_batched_tokens``, chunked prefill). When a running request cannot get a block the
newest running request is preempted (``self.running.pop()``), and ``_preempt_request`` frees its
blocks, sets ``num_computed_tokens = 0`` and puts it at the head of the waiting queue: on resume
its prompt AND the tokens it had generated are prefilled again. No waiting request is admitted in
a step that preempted. The async shell turns each step's token count into engine time.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


class Phase(enum.Enum):
    """Where a request is in the engine."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    KILLED = enum.auto()  # oom mode: the pool ran dry and the engine failed the request


@dataclass(frozen=True)
class Snapshot:
    """The pool's state and counters, as /metrics shows them."""

    running: int
    waiting: int
    used_blocks: int
    total_blocks: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    finished: Mapping[str, int] = field(default_factory=dict)
    recomputed_tokens: int = 0  # tokens prefilled again after a preemption (not a vLLM series)
    # Prompt and generated tokens of the requests that finished (vLLM's request_prompt_tokens
    # and request_generation_tokens histograms: their sums; their count is sum(finished)).
    finished_prompt_tokens: int = 0
    finished_generation_tokens: int = 0
    # Engine seconds the finished requests ran, first step to last (vLLM's
    # request_inference_time_seconds: its sum; the runner keeps the time, the pool has no clock).
    finished_inference_s: float = 0.0
    # How many of them ran at most each of INFERENCE_BUCKETS_S's bounds (cumulative, as
    # Prometheus buckets are; the +Inf bucket is their count).
    finished_inference_buckets: tuple[int, ...] = ()

    @property
    def kv_usage(self) -> float:
        """Fraction of the pool's blocks in use, 0..1 like vllm:kv_cache_usage_perc."""
        return self.used_blocks / self.total_blocks


# vLLM's bucket bounds for request_inference_time_seconds (the fixtures' histogram).
INFERENCE_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


@dataclass(frozen=True)
class Step:
    """What one engine step computed: the engine time it takes follows from its token counts."""

    tokens: Mapping[str, int] = field(default_factory=dict)  # request -> index of its new token
    prefill_tokens: int = 0  # prompt tokens, and tokens recomputed after a preemption
    decode_tokens: int = 0
    preempted: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()  # produced their last token this step; blocks already free
    killed: tuple[str, ...] = ()

    @property
    def scheduled_tokens(self) -> int:
        """Every token the step ran through the model."""
        return self.prefill_tokens + self.decode_tokens


@dataclass
class _Seq:
    prompt_tokens: int
    length: int  # the tokens this request will generate before it finishes
    generated: int = 0
    computed: int = 0  # vLLM's num_computed_tokens: tokens whose KV is in the blocks
    blocks: int = 0
    started: bool = False  # scheduled once: its prompt is counted in prompt_tokens
    preempted: bool = False  # lost its KV at least once: its prefill is a recompute
    hang_after: int | None = None  # a stalled engine: no step for it past this many tokens

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.generated


class KVPool:
    """Requests holding ceil(computed tokens / block_size) blocks each, stepped like vLLM V1."""

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        oom: bool,
        max_num_batched_tokens: int = 8192,
    ) -> None:
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._max_num_seqs = max_num_seqs
        self._budget = max_num_batched_tokens
        self._oom = oom
        self._seqs: dict[str, _Seq] = {}
        self._running: list[str] = []  # in admission order: the newest is preempted first
        self._waiting: deque[str] = deque()
        self._killed: set[str] = set()
        self._free = num_blocks
        self._counts = dict.fromkeys(
            (
                "preemptions",
                "prompt",
                "generation",
                "recomputed",
                "finished_prompt",
                "finished_generation",
            ),
            0,
        )
        self._finished = dict.fromkeys(FINISHED_REASONS, 0)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens occupy."""
        return -(-tokens // self._block_size)

    def submit(
        self, request_id: str, prompt_tokens: int, length: int, *, hang_after: int | None = None
    ) -> None:
        """Queue a request that will generate ``length`` tokens; the next step may schedule it.

        ``hang_after``: the engine stops stepping it after that many tokens, blocks held.
        """
        if request_id in self._seqs:
            raise ValueError(f"request {request_id!r} is already known")
        if prompt_tokens < 1 or length < 1:
            raise ValueError("a request needs at least one prompt token and one to generate")
        self._seqs[request_id] = _Seq(prompt_tokens, length, hang_after=hang_after)
        self._waiting.append(request_id)

    def phase(self, request_id: str) -> Phase | None:
        """Where the request is; None once it finished or was aborted."""
        if request_id in self._killed:
            return Phase.KILLED
        if request_id not in self._seqs:
            return None
        return Phase.RUNNING if request_id in self._running else Phase.WAITING

    @property
    def has_work(self) -> bool:
        """Whether a step could compute anything."""
        return bool(self._running or self._waiting)

    def step(self) -> Step:
        """One engine step: schedule within the token budget, compute, emit the new tokens."""
        budget = self._budget
        scheduled: dict[str, int] = {}
        preempted: list[str] = []
        index = 0
        while index < len(self._running) and budget > 0:
            request_id = self._running[index]
            seq = self._seqs[request_id]
            if seq.hang_after is not None and seq.generated >= seq.hang_after:
                index += 1  # hung: it keeps its blocks, and is stepped no more
                continue
            n = min(seq.tokens - seq.computed, budget)
            if not self._grow(request_id, seq.computed + n, preempted):
                if self._oom:
                    return Step(killed=self._kill_running())
                break  # it preempted itself: the newest running request had to go
            scheduled[request_id] = n
            budget -= n
            index += 1
        if not preempted:
            budget = self._admit(budget, scheduled)
        return self._compute(scheduled, tuple(preempted))

    def abort(self, request_id: str) -> None:
        """The client went away: free at once; like vLLM, not counted as a finished request."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        if request_id in self._killed:
            self._killed.discard(request_id)  # its blocks went back when it was killed
        elif request_id in self._running:
            self._running.remove(request_id)
            self._free += seq.blocks
        else:
            self._waiting.remove(request_id)

    def snapshot(self) -> Snapshot:
        """Current gauges and counters."""
        return Snapshot(
            running=len(self._running),
            waiting=len(self._waiting),
            used_blocks=self._num_blocks - self._free,
            total_blocks=self._num_blocks,
            preemptions=self._counts["preemptions"],
            prompt_tokens=self._counts["prompt"],
            generation_tokens=self._counts["generation"],
            finished=dict(self._finished),
            recomputed_tokens=self._counts["recomputed"],
            finished_prompt_tokens=self._counts["finished_prompt"],
            finished_generation_tokens=self._counts["finished_generation"],
        )

    def _grow(self, request_id: str, tokens: int, preempted: list[str]) -> bool:
        """Give a running request blocks for ``tokens``, preempting the newest until they fit."""
        seq = self._seqs[request_id]
        extra = self.blocks_for(tokens) - seq.blocks
        while extra > self._free:
            if self._oom:
                return False
            victim = self._preempt_newest()
            preempted.append(victim)
            if victim == request_id:
                return False
        self._free -= extra
        seq.blocks += extra
        return True

    def _admit(self, budget: int, scheduled: dict[str, int]) -> int:
        """Schedule waiting requests (new or preempted) head first while blocks and budget last."""
        while self._waiting and budget > 0 and len(self._running) < self._max_num_seqs:
            seq = self._seqs[self._waiting[0]]
            n = min(seq.tokens - seq.computed, budget)  # chunked prefill: a slice of a long one
            need = self.blocks_for(seq.computed + n) - seq.blocks
            if need > self._free:
                break  # head-of-line blocking, as in vLLM's FCFS scheduler
            request_id = self._waiting.popleft()
            self._free -= need
            seq.blocks += need
            if not seq.started:
                seq.started = True
                self._counts["prompt"] += seq.prompt_tokens
            self._running.append(request_id)
            scheduled[request_id] = n
            budget -= n
        return budget

    def _compute(self, scheduled: dict[str, int], preempted: tuple[str, ...]) -> Step:
        tokens: dict[str, int] = {}
        finished: list[str] = []
        prefill = decode = 0
        for request_id, n in scheduled.items():
            seq = self._seqs[request_id]
            if n == 1 and seq.computed == seq.tokens - 1 and seq.generated > 0:
                decode += 1
            else:
                prefill += n
                if seq.preempted:
                    self._counts["recomputed"] += n
            seq.computed += n
            if seq.computed < seq.tokens:
                continue  # a chunk of a prefill: no token yet
            tokens[request_id] = seq.generated
            seq.generated += 1
            self._counts["generation"] += 1
            if seq.generated == seq.length:
                self._finish(request_id)
                finished.append(request_id)
        return Step(tokens, prefill, decode, preempted, tuple(finished))

    def _finish(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id)
        self._running.remove(request_id)
        self._free += seq.blocks
        self._finished["length"] += 1
        self._counts["finished_prompt"] += seq.prompt_tokens
        self._counts["finished_generation"] += seq.generated

    def _preempt_newest(self) -> str:
        # vLLM's recompute preemption (_preempt_request): the newest running request frees its
        # blocks, forgets its computed tokens and goes to the front of the queue.
        victim = self._running.pop()
        seq = self._seqs[victim]
        self._free += seq.blocks
        seq.blocks = 0
        seq.computed = 0
        seq.preempted = True
        self._waiting.appendleft(victim)
        self._counts["preemptions"] += 1
        return victim

    def _kill_running(self) -> tuple[str, ...]:
        killed = tuple(self._running)
        for request_id in killed:
            self._free += self._seqs[request_id].blocks
            self._seqs[request_id].blocks = 0
            self._killed.add(request_id)
            self._finished["error"] += 1
        self._running.clear()
        return killed
