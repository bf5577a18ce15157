"""What to ask the engine's ``/tokenize`` so that it counts a completion's prompt as the completion
will render it (vLLM's chat and completion forms; pure, no I/O)."""

from __future__ import annotations

from typing import Any

from sidecar.core.request.prompt_estimate import Endpoint


def tokenize_payload(body: dict[str, Any], endpoint: Endpoint) -> dict[str, Any] | None:
    """vLLM's /tokenize request for this prompt; None where the estimate is exact or must do."""
    base = {"model": body["model"]} if isinstance(body.get("model"), str) else {}
    if endpoint == "responses":
        return None  # /tokenize knows no Responses input items: the estimate prices it
    if endpoint == "chat":
        return {**base, **_chat_render(body), "messages": body["messages"]}
    if isinstance(body.get("prompt"), str):
        return {**base, "prompt": body["prompt"]}
    return None  # token ids are counted exactly already; batches keep the estimate


def _chat_render(body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's chat /tokenize takes to render the prompt as the completion will: the tools,
    the template (a request's own, where vLLM trusts one) and its inputs (documents among them, as
    the completion passes them), the media processor's options, and whether the last message is
    continued or a reply is prompted."""
    render: dict[str, Any] = {"add_generation_prompt": True}
    for key in (
        "tools",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template",
        "mm_processor_kwargs",
    ):
        if body.get(key) is not None:
            render[key] = body[key]
    kwargs = body.get("chat_template_kwargs")
    documents = body.get("documents")
    if documents is not None:
        kwargs = {**(kwargs if isinstance(kwargs, dict) else {}), "documents": documents}
    if kwargs is not None:
        render["chat_template_kwargs"] = kwargs
    return render
