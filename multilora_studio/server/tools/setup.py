"""A chat request's tool handling, decided once: its prompt, the answer's format and the constraint."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from multilora_studio.engine import SamplingParams, StructuredOutput
from multilora_studio.engine.text.chat_tokens import Render
from multilora_studio.server.errors import ApiError
from multilora_studio.server.schemas import ChatCompletionRequest
from multilora_studio.server.tools.grammar import tool_structure
from multilora_studio.server.tools.prompt import tool_prompt
from multilora_studio.server.tools.spec import tool_request


@dataclass(frozen=True)
class ToolPlan:
    token_ids: list[int]
    format: str | None  # None: tool_choice none, the answer is plain content
    structure: StructuredOutput | None  # required / named tool_choice


def uses_tools(body: ChatCompletionRequest) -> bool:
    """Whether the request has tools, a tool_choice or tool turns in its history."""
    return (
        bool(body.tools)
        or body.tool_choice is not None
        or any(m.tool_calls or m.role == "tool" for m in body.messages)
    )


def tool_plan(
    body: ChatCompletionRequest,
    tokenizer: Any,
    render: Render,
    model_type: str,
    special_tokens_in_content: bool = False,
) -> ToolPlan:
    """Checks the tool options (400s), renders the prompt (with ``render``: ``tool_prompt``), and
    picks the format and constraint."""
    request = tool_request(body.tools, body.tool_choice, body.parallel_tool_calls)
    prompt = tool_prompt(tokenizer, render, model_type, body.messages, request, special_tokens_in_content)
    if request.mode == "none":
        return ToolPlan(prompt.token_ids, None, None)
    return ToolPlan(prompt.token_ids, prompt.format, tool_structure(request, prompt.format))


def with_tool_structure(
    params: list[SamplingParams], structure: StructuredOutput | None
) -> list[SamplingParams]:
    """The choices' parameters constrained to the forced call; with another constraint too, a 400."""
    if structure is None:
        return params
    if any(p.structured is not None for p in params):
        raise ApiError(
            400,
            "tool_choice required or named cannot be combined with another output constraint",
            "invalid_value",
            "tool_choice",
        )
    return [replace(p, structured=structure) for p in params]
