"""The token budget: the engine's max_model_len by default, narrowed by settings; and whether the
engine answers, judged from the age of its last good reading."""

from __future__ import annotations

import json

import pytest

from sidecar.core.errors import ProbeTemporaryError, RequestError
from sidecar.core.plan.token_budget import TokenBudget, resolve_budget
from sidecar.core.request.request_checks import TokenPolicy, check_request
from sidecar.live.engine_health import EngineHealth
from sidecar.live.probes import EngineReading
from sidecar.live.sources import Readings
from tests.declared import NOTHING_DECLARED


@pytest.mark.parametrize(
    ("prompt", "completion", "context", "expected"),
    [
        pytest.param(None, None, None, (3000, 1000, 4000, "fallback", "fallback"), id="nothing"),
        pytest.param(None, None, 32768, (32768, 32768, 32768, "engine", "engine"), id="engine"),
        pytest.param(100, None, 4096, (100, 4096, 4096, "setting", "engine"), id="prompt-set"),
        pytest.param(None, 500, 4096, (4096, 500, 4096, "engine", "setting"), id="completion"),
        pytest.param(100, 28, 4096, (100, 28, 128, "setting", "setting"), id="both-narrow"),
        pytest.param(9000, 9000, 4096, (4096, 4096, 4096, "engine", "engine"), id="wider"),
        pytest.param(4096, 1, 4096, (4096, 1, 4096, "setting", "setting"), id="at-the-limit"),
        pytest.param(100, None, None, (100, 1000, 1100, "setting", "fallback"), id="no-engine"),
    ],
)
def test_budget_follows_the_engine_and_settings_narrow_it(
    prompt: int | None,
    completion: int | None,
    context: int | None,
    expected: tuple[int, int, int, str, str],
) -> None:
    """Each case's prompt, completion and per-request budget, and where each half came from."""
    budget = resolve_budget(prompt, completion, context)
    assert (
        budget.prompt_tokens,
        budget.completion_tokens,
        budget.total_tokens,
        budget.prompt_origin,
        budget.completion_origin,
    ) == expected
    assert budget.plan_budget().total == expected[2]


def _policy(budget: TokenBudget) -> TokenPolicy:
    return TokenPolicy(
        max_prompt_tokens=budget.prompt_tokens,
        max_completion_tokens=budget.completion_tokens,
        context_tokens=budget.context_tokens,
        fill_max_tokens=budget.fills_max_tokens,
        prompt_budget_exact_only=budget.prompt_origin == "engine",
    )


CHAT = {"messages": [{"role": "user", "content": "x" * 400}]}  # 104 tokens as estimated


def test_the_engine_budget_leaves_a_missing_max_tokens_to_the_engine() -> None:
    """No max_tokens written in (the engine fills its context's rest); priced within the context."""
    checked = check_request(
        json.dumps(CHAT).encode(), "chat", _policy(resolve_budget(None, None, 1024))
    )
    assert b"max_tokens" not in checked.body
    assert (checked.prompt_tokens, checked.completion_tokens) == (104, 1024 - 104)


def test_a_set_completion_budget_is_still_written_in() -> None:
    """SIDECAR_MAX_COMPLETION_TOKENS set: a missing max_tokens gets it, as before."""
    checked = check_request(
        json.dumps(CHAT).encode(), "chat", _policy(resolve_budget(None, 50, 1024))
    )
    assert json.loads(checked.body)["max_tokens"] == 50


def test_an_estimate_never_refuses_a_prompt_under_the_engine_budget() -> None:
    """The prompt estimate (bytes / 4) is not the engine's count: only the engine refuses it."""
    long = {"messages": [{"role": "user", "content": "x" * 8000}]}  # ~2,004 tokens estimated
    checked = check_request(
        json.dumps(long).encode(), "chat", _policy(resolve_budget(None, None, 1024))
    )
    assert (checked.prompt_tokens, checked.completion_tokens) == (1024, 1)


def test_a_set_prompt_budget_still_refuses_by_the_estimate() -> None:
    """SIDECAR_MAX_PROMPT_TOKENS set: the operator's budget is enforced on the estimate."""
    with pytest.raises(RequestError) as caught:
        check_request(json.dumps(CHAT).encode(), "chat", _policy(resolve_budget(50, None, 1024)))
    assert caught.value.code == "prompt_over_budget"


def _readings(engine: EngineReading | None, error: str | None = None) -> Readings:
    declared = NOTHING_DECLARED
    failure = ProbeTemporaryError(error) if error else None
    return Readings(
        declared=declared, gpus=None, gpu_error=None, engine=engine, engine_error=failure
    )


def _reading(max_model_len: int | None = 4096) -> EngineReading:
    return EngineReading(
        cache=None,
        kv_usage_ratio=None,
        requests_running=None,
        requests_waiting=None,
        preemptions_total=None,
        observed_at=0.0,
        max_model_len=max_model_len,
    )


def test_engine_health_is_judged_by_the_age_of_the_last_good_reading() -> None:
    """Unready until a reading, ready while it is young, unready once it is older than allowed;
    max_model_len is kept through the outage."""
    health = EngineHealth()
    assert health.unready(0.0, 1.0) == "the engine has not answered yet"
    health.observe(_readings(None, "engine at x unreachable"), 0.5)
    assert health.unready(0.5, 1.0) == "the engine has not answered yet: engine at x unreachable"
    health.observe(_readings(_reading()), 1.0)
    health.observe(_readings(_reading(0)), 1.0)  # a nonsense length does not replace a good one
    assert health.unready(2.0, 1.0) is None
    health.observe(_readings(None, "refused"), 2.0)
    assert health.unready(2.0, 1.0) is None  # a failed read alone: the last good one is young
    assert health.unready(2.5, 1.0) == "the engine has not answered for 1.5s: refused"
    assert health.max_model_len == 4096
