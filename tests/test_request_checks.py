"""Request checks before admission: every bad input is a clear 400/413, good ones get a budget."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import RequestError
from sidecar.core.request.request_checks import (
    MESSAGE_OVERHEAD_TOKENS,
    TokenPolicy,
    check_request,
    with_prompt_tokens,
)

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
    checked = check_request(
        raw({**CHAT, "max_tokens": 999}),
        "chat",
        TokenPolicy(max_prompt_tokens=100, max_completion_tokens=50, over_budget="clamp"),
    )
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
    checked = check_request(
        body,
        "chat",
        TokenPolicy(max_prompt_tokens=100, max_completion_tokens=50, over_budget="clamp"),
    )
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
        pytest.param({"prompt": "abcd", "n": 2, "best_of": 5}, 5, 1, id="best-of-above-n"),
        pytest.param({"prompt": "abcd", "n": 3, "best_of": 2}, 3, 1, id="best-of-below-n"),
        pytest.param({"prompt": ["abcd"] * 2, "best_of": 3}, 6, 1, id="best-of-per-prompt"),
    ],
)
def test_sequences_and_prompt_estimate(
    body: dict[str, object], sequences: int, prompt_tokens: int
) -> None:
    """Batches and n>1 multiply the sequences a request pins; prompts are estimated from text."""
    checked = check_request(raw({"model": "m", **body}), "completions", BUDGET)
    assert (checked.sequences, checked.prompt_tokens) == (sequences, prompt_tokens)
    assert checked.total_tokens == (prompt_tokens + 50) * sequences


POOL = TokenPolicy(max_prompt_tokens=100, max_completion_tokens=50, pool_tokens=510)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        pytest.param({"prompt": "abcd", "n": 11}, "n", id="n"),  # 11 x 51 = 561
        pytest.param({"prompt": "abcd", "best_of": 11}, "best_of", id="best-of"),
        pytest.param({"prompt": ["abcd"] * 11}, "prompt", id="batch"),
        pytest.param({"prompt": [[1]] * 11}, "prompt", id="batch-of-ids"),
        pytest.param({"prompt": "abcd", "n": 2**63}, "n", id="n-2^63"),
        pytest.param({"prompt": "abcd", "n": 2, "max_tokens": 255}, "n", id="long-ones"),
    ],
)
def test_sequences_past_the_pool_are_too_large(body: dict[str, object], param: str) -> None:
    """Every sequence at its worst case, together past the engine's pool: 400 too_large, naming
    the field that multiplied them."""
    policy = TokenPolicy(max_prompt_tokens=100, max_completion_tokens=300, pool_tokens=510)
    budget = policy if "max_tokens" in body else POOL
    with pytest.raises(RequestError) as caught:
        check_request(raw({"model": "m", "max_tokens": 50, **body}), "completions", budget)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "too_large", param)


@pytest.mark.parametrize(
    ("body", "budget"),
    [
        pytest.param({"prompt": "abcd", "n": 10}, POOL, id="n-filling-the-pool"),  # 10 x 51
        pytest.param({"prompt": "abcd", "n": 10**6}, BUDGET, id="no-pool-known"),
        pytest.param(
            {"prompt": "x" * 400},
            TokenPolicy(max_prompt_tokens=100, max_completion_tokens=50, pool_tokens=10),
            id="one-sequence-is-admissions",
        ),
    ],
)
def test_sequences_the_pool_holds_pass(body: dict[str, object], budget: TokenPolicy) -> None:
    """Within the pool, without a pool to compare, or a single sequence (admission decides it:
    it waits, or the plan holds no request at all): passed on."""
    check_request(raw({"model": "m", "max_tokens": 50, **body}), "completions", budget)


def test_an_estimate_the_engine_will_count_prices_each_prompt_at_one_token() -> None:
    """With the engine's count to come, only the completions are certain: 10 x (1 + 50) fits."""
    budget = TokenPolicy(
        max_prompt_tokens=100, max_completion_tokens=50, count_from_engine=True, pool_tokens=510
    )
    checked = check_request(
        raw({"model": "m", "prompt": "x" * 400, "n": 10, "max_tokens": 50}), "completions", budget
    )
    assert checked.prompt_tokens == 100
    with pytest.raises(RequestError) as caught:
        with_prompt_tokens(checked, 2, budget)  # 10 x (2 + 50) = 520
    assert (caught.value.code, caught.value.param) == ("too_large", "n")
    assert with_prompt_tokens(checked, 1, budget).prompt_tokens == 1


def test_chat_prompt_counts_message_overhead_and_parts() -> None:
    """Chat prompts count every message's text parts plus a per-message template overhead."""
    messages = [
        {"role": "system", "content": "abcd"},
        {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]},
    ]
    checked = check_request(raw({"model": "m", "messages": messages}), "chat", BUDGET)
    assert checked.prompt_tokens == (4 + 1) + (4 + 2)


# --- text the engine cannot take: lone surrogates, content arrays of non-objects ---------------

HIGH = st.integers(0xD800, 0xDBFF)
LOW = st.integers(0xDC00, 0xDFFF)


def _escape(code: int) -> str:
    return f"\\u{code:04x}"


@given(
    lone=st.one_of(HIGH, LOW),
    before=st.text(max_size=8),
    where=st.sampled_from(["prompt", "model", "key", "content"]),
)
def test_a_lone_surrogate_anywhere_in_the_body_is_a_400(lone: int, before: str, where: str) -> None:
    """A JSON string holding an unpaired surrogate is refused, wherever it sits."""
    text = json.dumps(before)[1:-1] + _escape(lone)
    bodies = {
        "prompt": f'{{"prompt": "{text}"}}',
        "model": f'{{"prompt": "hi", "model": "{text}"}}',
        "key": f'{{"prompt": "hi", "{text}": 1}}',
        "content": f'{{"prompt": "hi", "metadata": {{"a": ["{text}"]}}}}',
    }
    with pytest.raises(RequestError) as caught:
        check_request(bodies[where].encode(), "completions", BUDGET)
    assert caught.value.code == "invalid_json"
    assert "surrogate" in caught.value.message


@given(high=HIGH, low=LOW)
def test_a_surrogate_pair_is_text_and_passes(high: int, low: int) -> None:
    """An escaped pair is one character outside the BMP: it is forwarded as it came."""
    body = f'{{"prompt": "{_escape(high)}{_escape(low)}", "max_tokens": 5}}'.encode()
    assert check_request(body, "completions", BUDGET).body == body


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"prompt": "\\\\ud800"}', id="escaped-backslash-not-an-escape"),
        pytest.param(b'{"prompt": "\\ud7ff\\ue000"}', id="either-side-of-the-range"),
    ],
)
def test_text_that_only_looks_like_a_surrogate_passes(body: bytes) -> None:
    """The quick scan may suspect these; the exact check lets them through."""
    assert check_request(body, "completions", BUDGET).prompt_tokens >= 1


@pytest.mark.parametrize(
    ("content", "endpoint"),
    [
        pytest.param([1], "chat", id="chat-number"),
        pytest.param([None], "chat", id="chat-null"),
        pytest.param([[{"type": "text", "text": "x"}]], "chat", id="chat-nested-array"),
        pytest.param([{"type": "text", "text": "x"}, 2.5], "chat", id="chat-part-then-float"),
        pytest.param([False], "responses", id="responses-bool"),
    ],
)
def test_content_arrays_of_non_objects_are_a_400(content: list[object], endpoint: str) -> None:
    """Each item of a content array must be a content part (an object) or, as vLLM takes, text."""
    if endpoint == "chat":
        body = {"messages": [{"role": "user", "content": content}]}
        param = "messages"
    else:
        body = {"input": [{"role": "user", "content": content}]}
        param = "input"
    with pytest.raises(RequestError) as caught:
        check_request(raw(body), endpoint, BUDGET)  # type: ignore[arg-type]
    assert (caught.value.code, caught.value.param) == ("invalid_type", param)


def test_a_string_content_part_is_priced_as_text() -> None:
    """vLLM reads a bare string in a content array as a text part: it passes, and is priced."""
    content = ["x" * 40, {"type": "text", "text": "y" * 40}]
    parts = {"messages": [{"role": "user", "content": content}]}
    checked = check_request(raw(parts), "chat", BUDGET)
    assert checked.prompt_tokens == MESSAGE_OVERHEAD_TOKENS + 20


# --- numbers the engine cannot take: NaN, Infinity, past a double's range ---------------------


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(b'{"model": "m", "temperature": NaN, "messages": []}', "NaN", id="nan"),
        pytest.param(b'{"temperature": Infinity}', "Infinity", id="infinity"),
        pytest.param(b'{"top_p": -Infinity}', "-Infinity", id="minus-infinity"),
        pytest.param(b'{"temperature": 1e999}', "too large", id="overflow"),
        pytest.param(b'{"logit_bias": {"5": -1e999}}', "too large", id="nested-overflow"),
        pytest.param(b'{"messages": [{"content": [NaN]}]}', "NaN", id="in-an-array"),
    ],
)
def test_a_number_json_has_not_is_a_400(body: bytes, said: str) -> None:
    """NaN, Infinity and 1e999 are refused as invalid JSON, wherever they sit, before the checks."""
    with pytest.raises(RequestError) as caught:
        check_request(body, "chat", BUDGET)
    assert (caught.value.code, caught.value.status) == ("invalid_json", 400)
    assert said in caught.value.message


def test_finite_numbers_pass() -> None:
    """The largest double and the smallest still parse; so does a number written as text."""
    body = raw({**CHAT, "temperature": 1e308, "top_p": 5e-324, "user": "NaN"})
    forwarded = json.loads(check_request(body, "chat", BUDGET).body)
    assert (forwarded["temperature"], forwarded["top_p"]) == (1e308, 5e-324)


def test_the_engine_counts_what_it_renders() -> None:
    """SIDECAR_PROMPT_TOKENS=engine: vLLM's chat /tokenize gets the tools, the template's inputs
    (documents among them) and the generation flags, so its count is the completion's prompt."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {
        **CHAT,
        "tools": tools,
        "documents": [{"text": "doc"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "continue_final_message": True,
        "add_generation_prompt": False,
        "chat_template": "{{ messages }}",
        "mm_processor_kwargs": {"max_pixels": 1024},
    }
    policy = TokenPolicy(max_prompt_tokens=100, max_completion_tokens=50, count_from_engine=True)
    assert check_request(raw(body), "chat", policy).tokenize == {
        "model": "m",
        "messages": CHAT["messages"],
        "tools": tools,
        "chat_template_kwargs": {"enable_thinking": False, "documents": [{"text": "doc"}]},
        "continue_final_message": True,
        "add_generation_prompt": False,
        "chat_template": "{{ messages }}",
        "mm_processor_kwargs": {"max_pixels": 1024},
    }


@pytest.mark.parametrize(
    ("body", "endpoint"),
    [
        pytest.param(
            {"model": "m", "input": "hi", "instructions": "x" * 2000},
            "responses",
            id="responses-input",
        ),
        pytest.param({"model": "m", "prompt": ["x" * 2000, "y"]}, "completions", id="a-batch"),
    ],
)
def test_what_the_engine_does_not_count_is_bounded_by_its_estimate(
    body: dict[str, object], endpoint: str
) -> None:
    """SIDECAR_PROMPT_TOKENS=engine: /tokenize takes no Responses input nor a batch, so the
    estimate bounds those (they were let through unchecked)."""
    policy = TokenPolicy(max_prompt_tokens=100, max_completion_tokens=50, count_from_engine=True)
    with pytest.raises(RequestError) as caught:
        check_request(raw(body), endpoint, policy)  # type: ignore[arg-type]
    assert caught.value.code == "prompt_over_budget"
