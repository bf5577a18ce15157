"""The pure model of a paged engine: a KV block pool, a FIFO waiting queue, preemption or OOM.

No clock, no I/O: the async shell calls ``submit``/``advance``/``finish``/``abort`` and wakes
the requests each call reports as newly scheduled.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


class Outcome(enum.Enum):
    """What happened when a running request asked for its next token."""

    TOKEN = enum.auto()  # the token was generated; its KV slot is allocated
    PREEMPTED = enum.auto()  # the request lost its blocks and waits to be rescheduled
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

    @property
    def kv_usage(self) -> float:
        """Fraction of the pool's blocks in use, 0..1 like vllm:kv_cache_usage_perc."""
        return self.used_blocks / self.total_blocks


@dataclass
class _Seq:
    prompt_tokens: int
    generated: int = 0
    blocks: int = 0
    prefilled: bool = False


class KVPool:
    """Requests holding ceil(tokens / block_size) blocks each, scheduled first come first served."""

    def __init__(self, *, num_blocks: int, block_size: int, max_num_seqs: int, oom: bool) -> None:
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._max_num_seqs = max_num_seqs
        self._oom = oom
        self._seqs: dict[str, _Seq] = {}
        self._running: list[str] = []  # in admission order: the newest is preempted first
        self._waiting: deque[str] = deque()
        self._killed: set[str] = set()
        self._free = num_blocks
        self._preemptions = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished = dict.fromkeys(FINISHED_REASONS, 0)

    def blocks_for(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens occupy (at least one)."""
        return max(1, -(-tokens // self._block_size))

    def submit(self, request_id: str, prompt_tokens: int) -> tuple[str, ...]:
        """Queue a request; returns the ids scheduled as a result (maybe this one)."""
        if request_id in self._seqs:
            raise ValueError(f"request {request_id!r} is already known")
        self._seqs[request_id] = _Seq(prompt_tokens=prompt_tokens)
        self._waiting.append(request_id)
        return self._schedule()

    def is_running(self, request_id: str) -> bool:
        """Whether the request holds its blocks now and may generate."""
        return request_id in self._running

    def is_killed(self, request_id: str) -> bool:
        """Whether an out-of-memory failure ended the request."""
        return request_id in self._killed

    def advance(self, request_id: str) -> Outcome:
        """Generate one token for a running request, growing its blocks when it needs one more."""
        if request_id in self._killed:
            return Outcome.KILLED
        if request_id not in self._running:
            return Outcome.PREEMPTED
        seq = self._seqs[request_id]
        extra = self.blocks_for(seq.prompt_tokens + seq.generated + 1) - seq.blocks
        while extra > self._free:
            if self._oom:
                self._kill_running()
                return Outcome.KILLED
            if self._preempt_newest() == request_id:
                return Outcome.PREEMPTED
        self._free -= extra
        seq.blocks += extra
        seq.generated += 1
        self._generation_tokens += 1
        return Outcome.TOKEN

    def finish(self, request_id: str, reason: str) -> tuple[str, ...]:
        """The request ended normally; count it, free its blocks, schedule the queue."""
        self._finished[reason] = self._finished.get(reason, 0) + 1
        return self._drop(request_id)

    def abort(self, request_id: str) -> tuple[str, ...]:
        """The client went away: free at once; like vLLM, not counted as a finished request."""
        return self._drop(request_id)

    def snapshot(self) -> Snapshot:
        """Current gauges and counters."""
        return Snapshot(
            running=len(self._running),
            waiting=len(self._waiting),
            used_blocks=self._num_blocks - self._free,
            total_blocks=self._num_blocks,
            preemptions=self._preemptions,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            finished=dict(self._finished),
        )

    def _drop(self, request_id: str) -> tuple[str, ...]:
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return ()
        if request_id in self._killed:
            self._killed.discard(request_id)  # its blocks went back when it was killed
        elif request_id in self._running:
            self._running.remove(request_id)
            self._free += seq.blocks
        else:
            self._waiting.remove(request_id)
        return self._schedule()

    def _schedule(self) -> tuple[str, ...]:
        scheduled: list[str] = []
        while self._waiting and len(self._running) < self._max_num_seqs:
            seq = self._seqs[self._waiting[0]]
            need = self.blocks_for(seq.prompt_tokens + seq.generated)
            if need > self._free:
                break  # head-of-line blocking, as in vLLM's FCFS scheduler
            request_id = self._waiting.popleft()
            self._free -= need
            seq.blocks = need
            if not seq.prefilled:
                seq.prefilled = True
                self._prompt_tokens += seq.prompt_tokens
            self._running.append(request_id)
            scheduled.append(request_id)
        return tuple(scheduled)

    def _preempt_newest(self) -> str:
        # vLLM's recompute preemption: the newest running request gives its blocks back and
        # goes to the front of the queue; its tokens are recomputed when it is rescheduled.
        victim = self._running.pop()
        seq = self._seqs[victim]
        self._free += seq.blocks
        seq.blocks = 0
        self._waiting.appendleft(victim)
        self._preemptions += 1
        return victim

    def _kill_running(self) -> None:
        for request_id in self._running:
            self._free += self._seqs[request_id].blocks
            self._seqs[request_id].blocks = 0
            self._killed.add(request_id)
            self._finished["error"] += 1
        self._running.clear()
