"""The emulated engine's pure scheduler: blocks, chunked prefill, preemption that recomputes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.kv_pool import KVPool, Phase, Step


def make_pool(
    num_blocks: int = 8,
    block_size: int = 4,
    max_num_seqs: int = 4,
    *,
    oom: bool = False,
    budget: int = 8192,
) -> KVPool:
    return KVPool(
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        oom=oom,
        max_num_batched_tokens=budget,
    )


def run(pool: KVPool, steps: int) -> list[Step]:
    return [pool.step() for _ in range(steps)]


@pytest.mark.parametrize(
    ("prompt", "steps", "blocks"),
    [
        pytest.param(3, 1, 1, id="prompt-in-one-block"),
        pytest.param(3, 2, 1, id="first-decode-fills-the-block"),
        pytest.param(3, 3, 2, id="second-decode-opens-a-second-block"),
        pytest.param(4, 5, 2, id="exactly-two-blocks"),
        pytest.param(4, 6, 3, id="ninth-token-opens-a-third-block"),
    ],
)
def test_blocks_hold_the_computed_tokens(prompt: int, steps: int, blocks: int) -> None:
    """After the prefill step and k decodes a request holds ceil((prompt + k) / block_size)."""
    pool = make_pool()
    pool.submit("a", prompt, 100)
    run(pool, steps)
    assert pool.snapshot().used_blocks == blocks


def test_a_step_gives_every_running_stream_one_token() -> None:
    """Prefill first (one token out), then each step is one decode token per running request."""
    pool = make_pool()
    pool.submit("a", 4, 3)
    pool.submit("b", 2, 3)
    steps = run(pool, 2)
    assert [(dict(s.tokens), s.prefill_tokens, s.decode_tokens) for s in steps] == [
        ({"a": 0, "b": 0}, 6, 0),
        ({"a": 1, "b": 1}, 0, 2),
    ]


def test_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    """A 10-token prompt with a 4-token budget takes 3 steps (4, 4, 2) before its first token."""
    pool = make_pool(budget=4)
    pool.submit("a", 10, 2)
    steps = run(pool, 3)
    assert [s.prefill_tokens for s in steps] == [4, 4, 2]
    assert [dict(s.tokens) for s in steps] == [{}, {}, {"a": 0}]


def test_decodes_take_the_budget_before_a_new_prompt() -> None:
    """Running requests are scheduled first; a new prompt gets what is left of the budget."""
    pool = make_pool(budget=6)
    pool.submit("a", 2, 10)
    pool.step()
    pool.submit("b", 20, 10)
    step = pool.step()
    assert (step.decode_tokens, step.prefill_tokens) == (1, 5)


def test_finished_request_frees_its_blocks_and_counts_as_length() -> None:
    """At its last token a request leaves the pool, counted in the finished counter."""
    pool = make_pool()
    pool.submit("a", 3, 2)
    steps = run(pool, 2)
    assert steps[-1].finished == ("a",)
    snap = pool.snapshot()
    assert (snap.used_blocks, snap.running, snap.finished["length"]) == (0, 0, 1)
    assert (snap.prompt_tokens, snap.generation_tokens) == (3, 2)
    assert pool.phase("a") is None


def test_max_num_seqs_queues_the_rest_until_one_finishes() -> None:
    """Beyond max_num_seqs requests wait, and a finish lets the next in line run."""
    pool = make_pool(max_num_seqs=2)
    for name in "abc":
        pool.submit(name, 1, 2)
    pool.step()
    assert (pool.phase("a"), pool.phase("c")) == (Phase.RUNNING, Phase.WAITING)
    pool.step()  # a and b finish
    assert pool.step().tokens == {"c": 0}


def test_full_pool_blocks_the_queue_head_of_line() -> None:
    """A prompt that does not fit waits, and a smaller one behind it waits too (FCFS)."""
    pool = make_pool(num_blocks=4)
    pool.submit("big", 12, 2)
    pool.submit("next", 8, 1)
    pool.submit("small", 1, 1)
    pool.step()
    assert pool.snapshot().waiting == 2
    pool.step()  # big finishes
    assert set(pool.step().tokens) == {"next", "small"}


def preempting_pool() -> KVPool:
    """old (4 tokens), short (4, 2 to generate), new (8): the second step cannot grow new."""
    pool = make_pool(num_blocks=6, block_size=4)
    pool.submit("old", 4, 12)
    pool.submit("short", 4, 2)
    pool.submit("new", 8, 12)
    return pool


def test_growth_preempts_the_newest_request() -> None:
    """When a running request needs a block and none is free, the newest one loses its KV."""
    pool = preempting_pool()
    _, second = run(pool, 2)
    assert second.preempted == ("new",)
    assert dict(second.tokens) == {"old": 1, "short": 1}
    assert pool.phase("new") is Phase.WAITING
    assert pool.snapshot().preemptions == 1


def test_preempted_request_recomputes_prompt_and_generated_tokens() -> None:
    """Resumed, the request prefills its prompt (8) and its generated token (1) again,
    in a step that also decodes the others: the recompute is part of their step."""
    pool = preempting_pool()
    _, _, resumed = run(pool, 3)
    assert resumed.prefill_tokens == 8 + 1
    assert dict(resumed.tokens) == {"old": 2, "new": 1}
    snap = pool.snapshot()
    assert (snap.recomputed_tokens, snap.prompt_tokens) == (9, 16)  # the prompt counts once


def test_no_request_is_admitted_in_a_step_that_preempted() -> None:
    """vLLM schedules no waiting request in a step that had to preempt."""
    pool = make_pool(num_blocks=3, block_size=2)
    pool.submit("a", 2, 10)
    pool.submit("b", 2, 10)
    pool.step()
    pool.submit("c", 1, 1)
    step = pool.step()
    assert step.preempted
    assert "c" not in step.tokens
    assert pool.phase("c") is Phase.WAITING


def test_oom_mode_kills_every_running_stream() -> None:
    """In oom mode running out of KV fails all in-flight requests instead of preempting."""
    pool = make_pool(num_blocks=2, block_size=2, oom=True)
    pool.submit("a", 2, 5)
    pool.submit("b", 2, 5)
    pool.step()
    step = pool.step()
    assert step.killed == ("a", "b")
    assert pool.phase("a") is Phase.KILLED
    snap = pool.snapshot()
    left = (snap.running, snap.used_blocks, snap.preemptions, snap.finished["error"])
    assert left == (0, 0, 0, 2)
    pool.abort("a")
    pool.abort("b")
    pool.submit("c", 2, 1)
    assert pool.step().tokens == {"c": 0}


def test_abort_frees_blocks_at_once_and_is_not_counted() -> None:
    """A client abort returns the blocks and is not counted as finished; twice is harmless."""
    pool = make_pool(num_blocks=2, block_size=2)
    pool.submit("a", 4, 5)
    pool.submit("b", 2, 5)
    pool.step()
    pool.abort("a")
    pool.abort("a")
    assert pool.step().tokens == {"b": 0}
    snap = pool.snapshot()
    assert (snap.running, snap.waiting, snap.used_blocks) == (1, 0, 1)
    assert sum(snap.finished.values()) == 0


def test_hung_request_keeps_its_blocks_and_is_stepped_no_more() -> None:
    """hang_after=2: two tokens, then the engine leaves it alone until it is aborted."""
    pool = make_pool()
    pool.submit("a", 3, 10, hang_after=2)
    assert [dict(s.tokens) for s in run(pool, 3)] == [{"a": 0}, {"a": 1}, {}]
    assert pool.snapshot().used_blocks == 1
    pool.abort("a")
    assert not pool.has_work


@pytest.mark.parametrize(
    ("prompt", "length"),
    [pytest.param(0, 1, id="no-prompt"), pytest.param(1, 0, id="nothing-to-generate")],
)
def test_empty_request_is_refused(prompt: int, length: int) -> None:
    """A request needs a prompt token and a token to generate."""
    with pytest.raises(ValueError, match="at least one"):
        make_pool().submit("a", prompt, length)


def test_duplicate_request_id_is_refused() -> None:
    """Two requests cannot share an id."""
    pool = make_pool()
    pool.submit("a", 1, 1)
    with pytest.raises(ValueError, match="already known"):
        pool.submit("a", 1, 1)


requests = st.lists(st.tuples(st.integers(1, 8), st.integers(1, 12)), min_size=1, max_size=8)


@given(requests, st.integers(2, 16), st.booleans())
def test_pool_never_overcommits_and_every_request_ends(
    sizes: list[tuple[int, int]], budget: int, oom: bool
) -> None:
    """Blocks stay within the pool, running within max_num_seqs, each step within the budget,
    and every request ends (finished, or killed in oom mode) with the pool empty after."""
    pool = make_pool(num_blocks=12, block_size=2, max_num_seqs=3, oom=oom, budget=budget)
    for number, (prompt, length) in enumerate(sizes):
        pool.submit(f"r{number}", prompt, length)
    for _ in range(2000):
        if not pool.has_work:
            break
        step = pool.step()
        for request_id in step.killed:
            pool.abort(request_id)
        snap = pool.snapshot()
        assert 0 <= snap.used_blocks <= snap.total_blocks
        assert snap.running <= 3
        assert step.scheduled_tokens <= budget
    snap = pool.snapshot()
    assert not pool.has_work
    assert snap.used_blocks == 0
    assert snap.finished["length"] + snap.finished["error"] >= 1
