"""The grammar that makes ``tool_choice`` required or named binding: exactly the parser's format.

A Lark grammar in llguidance's dialect whose ``%json`` rule holds the call's schema: the named
function's ``parameters``, or (required) a choice among every tool. The JSON is written as
``json.dumps`` writes it (``", "`` and ``": "``, no other whitespace: the engine's
``lark_json``, as for ``json_schema`` outputs), which also keeps a model from padding it
forever. The JSON formats (Llama 3, Mistral) are written without their special-token marker,
which their parsers do not need.
"""

from __future__ import annotations

import json
from typing import Any

from multilora_studio.engine import StructuredOutput
from multilora_studio.engine.sampling.grammar import lark_json
from multilora_studio.server.tools.formats import HERMES, HERMES_CLOSE, HERMES_OPEN, LLAMA3, MISTRAL
from multilora_studio.server.tools.spec import ToolRequest

ARGUMENT_KEYS = {HERMES: "arguments", LLAMA3: "parameters", MISTRAL: "arguments"}


def _json_rule(schema: dict[str, Any]) -> str:
    return f"body: {lark_json(schema)}"


def call_schema(request: ToolRequest, format_name: str) -> dict[str, Any]:
    """JSON Schema of one call: ``{"name": <const>, <arguments key>: <parameters>}`` per offered tool."""
    key = ARGUMENT_KEYS[format_name]
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, key: tool.parameters},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for tool in request.offered
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def tool_grammar(request: ToolRequest, format_name: str) -> str:
    """The Lark text; several calls only where ``parallel_tool_calls`` allows and the format has them."""
    call = call_schema(request, format_name)
    several = request.parallel and request.mode == "required"
    if format_name == MISTRAL:
        array: dict[str, Any] = {"type": "array", "items": call, "minItems": 1}
        if not several:
            array["maxItems"] = 1
        return f"start: body\n{_json_rule(array)}\n"
    if format_name == LLAMA3:
        return f"start: body\n{_json_rule(call)}\n"
    block = f"call: {json.dumps(HERMES_OPEN + chr(10))} body {json.dumps(chr(10) + HERMES_CLOSE)}"
    start = 'start: call ("\\n" call)*' if several else "start: call"
    return f"{start}\n{block}\n{_json_rule(call)}\n"


def tool_structure(request: ToolRequest, format_name: str) -> StructuredOutput | None:
    """The constraint for required / named tool_choice; None when the model may answer freely."""
    if request.mode not in ("required", "named"):
        return None
    return StructuredOutput(lark=tool_grammar(request, format_name))
