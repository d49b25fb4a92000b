"""A chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked (400s name the field)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from multilora_studio.server.errors import ApiError

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        """The tool as chat templates (and OpenAI) spell it."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    """What the request asks: ``mode`` is none, auto, required or named (then ``named`` is the tool)."""

    tools: tuple[Tool, ...]
    mode: str
    named: str | None = None
    parallel: bool = True

    @property
    def offered(self) -> tuple[Tool, ...]:
        """The tools the prompt shows: none when tool_choice is none, only the named one when named."""
        if self.mode == "none":
            return ()
        if self.mode == "named":
            return tuple(t for t in self.tools if t.name == self.named)
        return self.tools


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, "invalid_value", param)


def _tool(position: int, given: Any) -> Tool:
    where = f"tools.{position}"
    if not isinstance(given, dict) or given.get("type") != "function":
        raise _bad("each tool needs type 'function'", f"{where}.type")
    function = given.get("function")
    if not isinstance(function, dict):
        raise _bad("each tool needs a 'function' object", f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise _bad("a function name is 1-64 letters, digits, '_' or '-'", f"{where}.function.name")
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise _bad("a function description is a string", f"{where}.function.description")
    parameters = function.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise _bad("function parameters are a JSON Schema object", f"{where}.function.parameters")
    try:
        json.dumps(parameters)
    except (TypeError, ValueError):
        raise _bad("function parameters are not JSON", f"{where}.function.parameters") from None
    return Tool(name, description, parameters)


def _mode(choice: Any, tools: tuple[Tool, ...]) -> tuple[str, str | None]:
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise _bad("tool_choice 'required' needs tools", "tool_choice")
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise _bad(
            "tool_choice is 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    if all(tool.name != name for tool in tools):
        raise _bad(f"tool_choice names the function {name!r}, which is not among the tools", "tool_choice")
    return "named", name


def tool_request(tools: list[dict[str, Any]] | None, choice: Any, parallel: bool | None) -> ToolRequest:
    """The checked tool options of a request."""
    checked = tuple(_tool(i, given) for i, given in enumerate(tools or ()))
    names = [tool.name for tool in checked]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _bad(f"two tools are named {name!r}", f"tools.{i}.function.name")
    mode, named = _mode(choice, checked)
    return ToolRequest(checked, mode, named, True if parallel is None else bool(parallel))
