"""The warning table: every code has a description, messages carry the numbers."""

from __future__ import annotations

from typing import get_args

from sidecar.core.warnings import (
    WARNING_CODES,
    WarningCode,
    changes,
    model_mismatch,
    no_capacity,
)


def test_every_code_in_the_table() -> None:
    """The Literal and the table name the same codes."""
    assert set(get_args(WarningCode)) == set(WARNING_CODES)


def test_no_capacity_message_shows_the_arithmetic() -> None:
    """Pool tokens, alpha and the request's tokens are all in the message."""
    message = no_capacity(1000, 1200, 0.8).message
    assert "1,000 tokens" in message
    assert "alpha 0.8" in message
    assert "800 tokens" in message
    assert "1,200 tokens" in message


def test_changes_by_code() -> None:
    """New codes are raised, vanished ones cleared, kept ones neither."""
    mismatch = model_mismatch(57_344, 1024, 0.1)
    empty = no_capacity(1, 2, 0.5)
    raised, cleared = changes((mismatch,), (model_mismatch(2, 1, 0.1), empty))
    assert raised == (empty,)
    assert cleared == ()
    assert changes((mismatch, empty), ()) == ((), (mismatch, empty))
