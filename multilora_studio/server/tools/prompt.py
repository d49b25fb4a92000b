"""Chat prompts with tools: through the model's template when it renders ``tools``, else the fallback.

The fallback (a template that ignores ``tools``, such as SmolLM2's) adds a Hermes-style system
block listing the functions and writes earlier calls and results as Hermes text, so the model
answers in the ``hermes`` format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from multilora_studio.engine.text.chat_tokens import Render, chat_token_ids
from multilora_studio.engine.text.template_sandbox import TemplateBusy, TemplateLimitError
from multilora_studio.server.errors import ApiError
from multilora_studio.server.prompt_errors import prompt_error
from multilora_studio.server.sampling import chat_prompt
from multilora_studio.server.schemas import ChatMessage
from multilora_studio.server.tools.formats import (
    HERMES,
    HERMES_OPEN,
    LLAMA3,
    MISTRAL,
    MISTRAL_MARKER,
    hermes_text,
)
from multilora_studio.server.tools.spec import Tool, ToolRequest

PROBE_NAME = "multilora_probe_function_x7"
FAMILY_FORMATS = {"llama": LLAMA3, "mistral": MISTRAL, "qwen2": HERMES, "qwen3": HERMES}
FALLBACK_SYSTEM = (
    "You may call one or more functions to assist with the user query. The functions are listed "
    "in <tools></tools>:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
_TEMPLATE_RENDERS_TOOLS: dict[str, bool] = {}  # chat template text -> whether it shows `tools`


@dataclass(frozen=True)
class ToolPrompt:
    token_ids: list[int]
    format: str  # the format the answer is parsed in (formats.PARSERS)
    native: bool  # False: the fallback prompt


def renders_tools(tokenizer: Any, render: Render) -> bool:
    """Whether the chat template shows ``tools``: a probe conversation rendered with and without one."""
    template = str(tokenizer.chat_template)
    if template not in _TEMPLATE_RENDERS_TOOLS:
        probe = [{"role": "user", "content": "hello"}]
        tool = Tool(PROBE_NAME, "probe", {"type": "object", "properties": {}}).openai()
        try:
            shown = render(tokenizer, probe, tools=[tool], add_generation_prompt=True)
        except (TemplateLimitError, TemplateBusy):  # past its limits: no answer to remember
            raise
        except Exception:  # a template that cannot take tools at all
            shown = ""
        _TEMPLATE_RENDERS_TOOLS[template] = PROBE_NAME in shown
    return _TEMPLATE_RENDERS_TOOLS[template]


def call_format(tokenizer: Any, render: Render, model_type: str) -> str:
    """The parser: hermes for the fallback; else the template's own markers; else the family's."""
    if not renders_tools(tokenizer, render):
        return HERMES
    template = str(tokenizer.chat_template)
    if HERMES_OPEN in template:
        return HERMES
    if MISTRAL_MARKER in template:
        return MISTRAL
    return FAMILY_FORMATS.get(model_type, HERMES)


def _history_calls(position: int, message: ChatMessage) -> list[tuple[str, dict[str, Any], str]]:
    """(name, arguments, id) of an assistant message's ``tool_calls``; a 400 naming the bad one."""
    calls = []
    for j, call in enumerate(message.tool_calls or ()):
        where = f"messages.{position}.tool_calls.{j}"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, "a tool call needs function.name", "invalid_value", f"{where}.function.name")
        arguments = function.get("arguments", "{}")
        try:
            decoded = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            raise ApiError(
                400, "tool call arguments are a JSON object", "invalid_value", f"{where}.function.arguments"
            )
        calls.append((function["name"], decoded, str(call.get("id") or "")))
    return calls


def _native_messages(given: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as tool-aware templates (HF's convention) expect them."""
    messages: list[dict[str, Any]] = []
    for position, (message, plain) in enumerate(zip(given, chat_prompt(given), strict=True)):
        item: dict[str, Any] = dict(plain)
        calls = _history_calls(position, message)
        if calls:
            item["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for n, a, i in calls
            ]
        if message.role == "tool" and message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            item["name"] = message.name
        messages.append(item)
    return messages


def _fallback_messages(given: list[ChatMessage], tools: tuple[Tool, ...]) -> list[dict[str, Any]]:
    """Plain messages: calls as Hermes text, tool results as user turns, the tools in a system block."""
    messages: list[dict[str, Any]] = []
    for position, (message, plain) in enumerate(zip(given, chat_prompt(given), strict=True)):
        calls = _history_calls(position, message)
        content = plain["content"]
        if calls:
            content = "\n".join(
                part for part in (content, hermes_text([(n, a) for n, a, _ in calls])) if part
            )
        if message.role == "tool":
            messages.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            messages.append({"role": plain["role"], "content": content})
    if tools:
        block = FALLBACK_SYSTEM.format(
            tools="\n".join(json.dumps(t.openai(), ensure_ascii=False) for t in tools)
        )
        if messages and messages[0]["role"] == "system":
            messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}
        else:
            messages.insert(0, {"role": "system", "content": block})
    return messages


def tool_prompt(
    tokenizer: Any,
    render: Render,
    model_type: str,
    given: list[ChatMessage],
    request: ToolRequest,
    special_tokens_in_content: bool = False,
) -> ToolPrompt:
    """The prompt's token ids and the answer's format; template errors are a 400 about ``messages``
    (``prompt_error``). ``render`` renders the template (``ServingEngine.renderer_for``)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ApiError(400, "this model has no chat template; tools need one", "invalid_value", "messages")
    tools = [tool.openai() for tool in request.offered]
    try:
        native = renders_tools(tokenizer, render)
        if native:
            ids = chat_token_ids(
                tokenizer,
                _native_messages(given),
                special_tokens_in_content,
                render=render,
                tools=tools or None,
                add_generation_prompt=True,
            )
        else:
            ids = chat_token_ids(
                tokenizer,
                _fallback_messages(given, request.offered),
                special_tokens_in_content,
                render=render,
                add_generation_prompt=True,
            )
    except ApiError:
        raise
    except Exception as error:  # the template can refuse a conversation (jinja errors)
        raise prompt_error(error, "messages") from None
    return ToolPrompt(ids, call_format(tokenizer, render, model_type), native)
