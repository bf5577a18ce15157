"""The promises made to refused callers (sidecar.core.admission.returns)."""

from __future__ import annotations

import pytest

from sidecar.core.admission.returns import EARLY_S, KEEP_S, Returns, fingerprint

A, B, C = fingerprint(None, "/v1/chat/completions", b"a"), b"b" * 16, b"c" * 16


def test_a_caller_back_when_told_is_known_once() -> None:
    returns = Returns()
    returns.told(A, due_at=10.0, now=0.0)
    assert returns.back(A, 10.0)
    assert not returns.back(A, 10.5)  # kept once: the same request again is a newcomer
    assert len(returns) == 0


def test_one_back_too_early_is_a_newcomer_and_its_promise_stands() -> None:
    returns = Returns()
    returns.told(A, due_at=10.0, now=0.0)
    assert not returns.back(A, 10.0 - EARLY_S - 0.01)
    assert returns.back(A, 10.0 - EARLY_S)  # whole-second Retry-After, read rounded down


def test_the_latest_word_stands() -> None:
    returns = Returns()
    returns.told(A, due_at=10.0, now=0.0)
    returns.told(A, due_at=30.0, now=5.0)  # refused again, told later
    assert not returns.back(A, 20.0)
    assert returns.back(A, 30.0)


def test_a_promise_lapses_after_its_keep() -> None:
    returns = Returns()
    returns.told(A, due_at=10.0, now=0.0)
    assert not returns.back(A, 10.0 + KEEP_S + 0.01)
    assert len(returns) == 0  # and is gone


def test_lapsed_promises_are_dropped_as_new_ones_come() -> None:
    returns = Returns()
    returns.told(A, due_at=1.0, now=0.0)
    returns.told(B, due_at=2.0 + KEEP_S, now=1.0 + KEEP_S + 0.01)
    assert len(returns) == 1
    assert returns.back(B, 2.0 + KEEP_S)


def test_nothing_is_pending_once_every_promise_has_lapsed() -> None:
    returns = Returns()
    returns.told(A, due_at=10.0, now=0.0)
    assert returns.pending(10.0 + KEEP_S)
    assert not returns.pending(10.0 + KEEP_S + 0.01)
    assert len(returns) == 0


def test_at_most_size_are_kept_the_oldest_told_going_first() -> None:
    returns = Returns(size=2)
    for key in (A, B, C):
        returns.told(key, due_at=5.0, now=0.0)
    assert len(returns) == 2
    assert not returns.back(A, 5.0)
    assert returns.back(B, 5.0)
    assert returns.back(C, 5.0)


def test_a_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="size"):
        Returns(size=0)


@pytest.mark.parametrize(
    "other",
    [
        ("key-1", "/v1/chat/completions", b"a"),  # another tenant
        (None, "/v1/completions", b"a"),  # another path
        (None, "/v1/chat/completions", b"a "),  # another body
        (None, "/v1/chat/completions", None),  # no body
    ],
)
def test_a_fingerprint_tells_tenant_path_and_body_apart(
    other: tuple[str | None, str, bytes | None],
) -> None:
    assert fingerprint(*other) != A
    assert fingerprint(None, "/v1/chat/completions", b"a") == A


def test_a_fingerprint_does_not_run_its_parts_together() -> None:
    assert fingerprint("ab", "c", b"") != fingerprint("a", "bc", b"")
    assert len(A) == 16
