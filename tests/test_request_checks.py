"""Request checks before admission: every bad input is a clear 400/413, good ones get a budget."""

from __future__ import annotations

import json

import pytest

from sidecar.core.errors import RequestError
from sidecar.core.request_checks import TokenPolicy, check_request

BUDGET = TokenPolicy(max_prompt_tokens=100, max_completion_tokens=50)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


def raw(body: object) -> bytes:
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("body", "endpoint", "code", "param"),
    [
        pytest.param(b"{not json", "chat", "invalid_json", None, id="malformed-json"),
        pytest.param(b"\xff\xfe", "chat", "invalid_json", None, id="not-utf8"),
        pytest.param(raw([1, 2]), "chat", "invalid_json", None, id="array-not-object"),
        pytest.param(
            raw({**CHAT, "stream": "yes"}), "chat", "invalid_type", "stream", id="stream-string"
        ),
        pytest.param(
            raw({**CHAT, "max_tokens": "10"}),
            "chat",
            "invalid_type",
            "max_tokens",
            id="max-tokens-string",
        ),
        pytest.param(
            raw({**CHAT, "max_tokens": True}),
            "chat",
            "invalid_type",
            "max_tokens",
            id="max-tokens-bool",
        ),
        pytest.param(
            raw({**CHAT, "max_tokens": 0}),
            "chat",
            "invalid_value",
            "max_tokens",
            id="max-tokens-zero",
        ),
        pytest.param(
            raw({**CHAT, "max_tokens": -5}),
            "chat",
            "invalid_value",
            "max_tokens",
            id="max-tokens-negative",
        ),
        pytest.param(
            raw({**CHAT, "max_completion_tokens": 10**12}),
            "chat",
            "max_tokens_over_budget",
            "max_completion_tokens",
            id="absurd-max-completion-tokens",
        ),
        pytest.param(raw({**CHAT, "n": 0}), "chat", "invalid_value", "n", id="n-zero"),
        pytest.param(raw({**CHAT, "model": 3}), "chat", "invalid_type", "model", id="model-number"),
        pytest.param(
            raw({"model": "m", "messages": []}),
            "chat",
            "invalid_request",
            "messages",
            id="no-messages",
        ),
        pytest.param(
            raw({"model": "m", "messages": "hi"}),
            "chat",
            "invalid_request",
            "messages",
            id="messages-string",
        ),
        pytest.param(
            raw({"model": "m", "prompt": 5}),
            "completions",
            "invalid_request",
            "prompt",
            id="prompt-number",
        ),
        pytest.param(
            raw({"model": "m", "prompt": "word " * 500}),
            "completions",
            "prompt_over_budget",
            "prompt",
            id="prompt-over-budget",
        ),
    ],
)
def test_bad_input_is_rejected_with_its_param(
    body: bytes, endpoint: str, code: str, param: str | None
) -> None:
    """Each kind of bad input raises a 400 naming the offending field."""
    with pytest.raises(RequestError) as caught:
        check_request(body, endpoint, BUDGET)  # type: ignore[arg-type]
    assert caught.value.status == 400
    assert caught.value.code == code
    assert caught.value.param == param


def test_a_byte_order_mark_is_named_in_the_refusal() -> None:
    """A UTF-8 body behind a byte order mark is refused with a message that says so."""
    with pytest.raises(RequestError, match="byte order mark") as caught:
        check_request(b"\xef\xbb\xbf" + raw(CHAT), "chat", BUDGET)
    assert (caught.value.code, caught.value.status) == ("invalid_json", 400)


def test_over_budget_message_names_the_budget() -> None:
    """The refusal of a too-large max_tokens tells the client the budget."""
    with pytest.raises(RequestError, match="completion budget of 50 tokens"):
        check_request(raw({**CHAT, "max_tokens": 51}), "chat", BUDGET)


def test_missing_max_tokens_is_set_to_the_budget() -> None:
    """Without max_tokens the forwarded body carries the completion budget."""
    checked = check_request(raw(CHAT), "chat", BUDGET)
    assert json.loads(checked.body)["max_tokens"] == 50
    assert checked.completion_tokens == 50


def test_within_budget_body_is_forwarded_untouched() -> None:
    """A request inside the budget is forwarded byte for byte."""
    body = raw({**CHAT, "max_tokens": 7, "stream": True})
    checked = check_request(body, "chat", BUDGET)
    assert checked.body == body
    assert (checked.stream, checked.completion_tokens) == (True, 7)


def test_clamp_mode_lowers_max_tokens_to_the_budget() -> None:
    """With over_budget=clamp a too-large max_tokens is lowered instead of refused."""
    checked = check_request(raw({**CHAT, "max_tokens": 999}), "chat", TokenPolicy(100, 50, "clamp"))
    assert json.loads(checked.body)["max_tokens"] == 50


def test_both_token_fields_price_by_the_larger() -> None:
    """max_tokens and max_completion_tokens both given within budget: priced by the larger, and
    forwarded as sent."""
    body = raw({**CHAT, "max_completion_tokens": 9, "max_tokens": 30})
    checked = check_request(body, "chat", BUDGET)
    assert (checked.completion_tokens, checked.body) == (30, body)


def test_the_field_over_budget_is_the_one_named() -> None:
    """Of the two fields, the refusal names the one above the budget."""
    body = raw({**CHAT, "max_completion_tokens": 9, "max_tokens": 51})
    with pytest.raises(RequestError, match="'max_tokens' is 51") as caught:
        check_request(body, "chat", BUDGET)
    assert caught.value.param == "max_tokens"


def test_clamp_mode_lowers_each_field_over_budget() -> None:
    """With over_budget=clamp every field above the budget is lowered; one within it stays."""
    body = raw({**CHAT, "max_completion_tokens": 70, "max_tokens": 9})
    checked = check_request(body, "chat", TokenPolicy(100, 50, "clamp"))
    forwarded = json.loads(checked.body)
    assert (forwarded["max_completion_tokens"], forwarded["max_tokens"]) == (50, 9)
    assert checked.completion_tokens == 50


@pytest.mark.parametrize(
    ("body", "sequences", "prompt_tokens"),
    [
        pytest.param({"prompt": "abcdefgh"}, 1, 2, id="text-4-bytes-per-token"),
        pytest.param({"prompt": [1, 2, 3]}, 1, 3, id="token-ids"),
        pytest.param({"prompt": ["abcd", "abcdefgh"]}, 2, 2, id="batch-of-texts"),
        pytest.param({"prompt": [[1], [1, 2, 3, 4]]}, 2, 4, id="batch-of-token-ids"),
        pytest.param({"prompt": "abcd", "n": 3}, 3, 1, id="n-choices"),
    ],
)
def test_sequences_and_prompt_estimate(
    body: dict[str, object], sequences: int, prompt_tokens: int
) -> None:
    """Batches and n>1 multiply the sequences a request pins; prompts are estimated from text."""
    checked = check_request(raw({"model": "m", **body}), "completions", BUDGET)
    assert (checked.sequences, checked.prompt_tokens) == (sequences, prompt_tokens)
    assert checked.total_tokens == (prompt_tokens + 50) * sequences


def test_chat_prompt_counts_message_overhead_and_parts() -> None:
    """Chat prompts count every message's text parts plus a per-message template overhead."""
    messages = [
        {"role": "system", "content": "abcd"},
        {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]},
    ]
    checked = check_request(raw({"model": "m", "messages": messages}), "chat", BUDGET)
    assert checked.prompt_tokens == (4 + 1) + (4 + 2)
