"""The emulated engine's pure KV pool: block growth, queueing, preemption, OOM and aborts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.kv_pool import KVPool, Outcome


def make_pool(
    num_blocks: int = 8, block_size: int = 4, max_num_seqs: int = 4, *, oom: bool = False
) -> KVPool:
    return KVPool(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs, oom=oom)


@pytest.mark.parametrize(
    ("prompt", "generated", "blocks"),
    [
        pytest.param(3, 0, 1, id="prompt-in-one-block"),
        pytest.param(3, 1, 1, id="fills-the-first-block"),
        pytest.param(3, 2, 2, id="fifth-token-opens-a-second-block"),
        pytest.param(4, 4, 2, id="exactly-two-blocks"),
        pytest.param(4, 5, 3, id="ninth-token-opens-a-third-block"),
    ],
)
def test_blocks_grow_as_tokens_are_generated(prompt: int, generated: int, blocks: int) -> None:
    """A running request holds ceil((prompt + generated) / block_size) blocks."""
    pool = make_pool()
    assert pool.submit("a", prompt) == ("a",)
    for _ in range(generated):
        assert pool.advance("a") is Outcome.TOKEN
    assert pool.snapshot().used_blocks == blocks


def test_max_num_seqs_queues_the_rest_until_one_finishes() -> None:
    """Beyond max_num_seqs requests wait, and a finish schedules the next in line."""
    pool = make_pool(max_num_seqs=2)
    pool.submit("a", 1)
    pool.submit("b", 1)
    assert pool.submit("c", 1) == ()
    assert (pool.snapshot().running, pool.snapshot().waiting) == (2, 1)
    assert pool.advance("c") is Outcome.PREEMPTED
    assert pool.finish("a", "length") == ("c",)
    assert pool.is_running("c")


def test_full_pool_blocks_the_queue_head_of_line() -> None:
    """A prompt that does not fit waits, and a smaller one behind it waits too (FCFS)."""
    pool = make_pool(num_blocks=4)
    pool.submit("big", 12)
    assert pool.submit("next", 8) == ()
    assert pool.submit("small", 1) == ()
    assert pool.snapshot().waiting == 2
    assert pool.finish("big", "length") == ("next", "small")


def test_growth_preempts_the_newest_request() -> None:
    """When a token needs a block and none is free, the newest request is preempted."""
    pool = make_pool(num_blocks=2, block_size=2)
    pool.submit("old", 2)
    pool.submit("new", 2)
    assert pool.advance("old") is Outcome.TOKEN
    assert pool.advance("new") is Outcome.PREEMPTED
    snap = pool.snapshot()
    assert (snap.running, snap.waiting, snap.preemptions, snap.used_blocks) == (1, 1, 1, 2)
    assert pool.finish("old", "length") == ("new",)


def test_newest_request_preempts_itself_when_it_is_the_one_growing() -> None:
    """The newest request needing a block gives its own blocks back and waits."""
    pool = make_pool(num_blocks=2, block_size=2)
    pool.submit("old", 2)
    pool.submit("new", 2)
    assert pool.advance("new") is Outcome.PREEMPTED
    assert pool.is_running("old")
    assert pool.snapshot().used_blocks == 1


def test_preempted_request_is_recomputed_with_its_generated_tokens() -> None:
    """Rescheduling needs blocks for prompt plus tokens already generated; prompt counts once."""
    pool = make_pool(num_blocks=3, block_size=2)
    pool.submit("old", 2)
    pool.submit("new", 2)
    assert pool.advance("new") is Outcome.TOKEN  # new: 3 tokens, 2 blocks; pool full
    assert pool.advance("old") is Outcome.TOKEN  # preempts new
    assert not pool.is_running("new")
    pool.finish("old", "length")
    assert pool.is_running("new")
    snap = pool.snapshot()
    assert (snap.used_blocks, snap.prompt_tokens, snap.preemptions) == (2, 4, 1)


def test_oom_mode_kills_every_running_stream() -> None:
    """In oom mode running out of KV fails all in-flight requests instead of preempting."""
    pool = make_pool(num_blocks=2, block_size=2, oom=True)
    pool.submit("a", 2)
    pool.submit("b", 2)
    assert pool.advance("a") is Outcome.KILLED
    assert pool.advance("b") is Outcome.KILLED
    snap = pool.snapshot()
    assert (snap.running, snap.used_blocks, snap.preemptions) == (0, 0, 0)
    assert snap.finished["error"] == 2
    pool.abort("a")
    pool.abort("b")
    assert pool.submit("c", 2) == ("c",)


def test_abort_frees_blocks_at_once_and_schedules_the_queue() -> None:
    """A client abort returns the blocks, lets a waiter in, and is not counted as finished."""
    pool = make_pool(num_blocks=2, block_size=2)
    pool.submit("a", 4)
    pool.submit("b", 2)
    assert pool.abort("a") == ("b",)
    snap = pool.snapshot()
    assert (snap.running, snap.waiting, snap.used_blocks) == (1, 0, 1)
    assert sum(snap.finished.values()) == 0


def test_abort_of_a_waiting_request_leaves_the_queue() -> None:
    """Aborting a queued request removes it; aborting twice is harmless."""
    pool = make_pool(max_num_seqs=1)
    pool.submit("a", 1)
    pool.submit("b", 1)
    assert pool.abort("b") == ()
    assert pool.abort("b") == ()
    assert pool.snapshot().waiting == 0


def test_duplicate_request_id_is_refused() -> None:
    """Two requests cannot share an id."""
    pool = make_pool()
    pool.submit("a", 1)
    with pytest.raises(ValueError, match="already known"):
        pool.submit("a", 1)


def test_usage_and_counters_read_like_vllm() -> None:
    """kv_usage is a 0..1 fraction; token and success counters add up."""
    pool = make_pool(num_blocks=4, block_size=4)
    pool.submit("a", 4)
    pool.advance("a")
    snap = pool.snapshot()
    assert snap.kv_usage == 0.5
    pool.finish("a", "length")
    snap = pool.snapshot()
    assert (snap.prompt_tokens, snap.generation_tokens, snap.finished["length"]) == (4, 1, 1)
    assert snap.kv_usage == 0.0


operations = st.lists(
    st.tuples(st.sampled_from(["submit", "advance", "finish", "abort"]), st.integers(0, 5),
              st.integers(1, 9)),
    max_size=60,
)  # fmt: skip


@given(operations, st.booleans())
def test_pool_never_overcommits(ops: list[tuple[str, int, int]], oom: bool) -> None:
    """Whatever happens, blocks in use stay within the pool and running within max_num_seqs."""
    pool = make_pool(num_blocks=6, block_size=2, max_num_seqs=3, oom=oom)
    known: set[str] = set()
    for op, key, prompt in ops:
        request_id = f"r{key}"
        if op == "submit" and request_id not in known:
            pool.submit(request_id, prompt)
            known.add(request_id)
        elif op == "advance" and request_id in known:
            pool.advance(request_id)
        elif op in ("finish", "abort") and request_id in known:
            pool.abort(request_id) if op == "abort" else pool.finish(request_id, "length")
            known.discard(request_id)
        snap = pool.snapshot()
        assert 0 <= snap.used_blocks <= snap.total_blocks
        assert snap.running <= 3
        assert snap.running + snap.waiting <= len(known)
    for request_id in list(known):
        pool.abort(request_id)
    assert pool.snapshot().used_blocks == 0
