"""The tool-call formats the engine's families write, and parsing a completion into text and calls.

``hermes`` (Qwen2.5, Hermes, the fallback prompt): one block per call,
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.
``llama3_json`` (Llama 3.x): the whole answer is ``{"name": ..., "parameters": {...}}``,
optionally after ``<|python_tag|>``, several separated by ``;``. ``mistral``:
``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (the marker is a special token, which the
detokenizer may drop, so a leading JSON array counts too). A call that does not parse stays text.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HERMES, LLAMA3, MISTRAL = "hermes", "llama3_json", "mistral"
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG, MISTRAL_MARKER = "<|python_tag|>", "[TOOL_CALLS]"
HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, compact
    id: str = ""

    def openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class Parsed:
    """A completion split: ``content`` the text outside the calls (None when only whitespace)."""

    content: str | None
    calls: tuple[ToolCall, ...]


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _call(value: Any, key: str) -> ToolCall | None:
    """A call from a decoded JSON value, or None when it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(key, value.get("arguments" if key != "arguments" else "parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False), call_id())


def _content(parts: list[str]) -> str | None:
    text = "".join(parts)
    return text if text.strip() else None


def parse_hermes(text: str) -> Parsed:
    parts, calls, last = [], [], 0
    for match in HERMES_BLOCK.finditer(text):
        try:
            call = _call(json.loads(match.group(1)), "arguments")
        except ValueError:
            call = None
        if call is None:
            continue  # left as text
        parts.append(text[last : match.start()])
        calls.append(call)
        last = match.end()
    parts.append(text[last:])
    return Parsed(_content(parts), tuple(calls)) if calls else Parsed(_content([text]), ())


def _json_values(body: str, separators: str) -> list[Any] | None:
    """Every JSON value in ``body``, separated by whitespace or ``separators``; None unless it is all JSON."""
    decoder, at = json.JSONDecoder(), 0
    values: list[Any] = []
    while True:
        while at < len(body) and (body[at].isspace() or body[at] in separators):
            at += 1
        if at == len(body):
            return values
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            return None
        values.append(value)


def parse_llama3(text: str) -> Parsed:
    body = text.strip()
    body = body.removeprefix(PYTHON_TAG)
    if not body.lstrip().startswith("{"):
        return Parsed(_content([text]), ())
    values = _json_values(body, ";")
    calls = [_call(value, "parameters") for value in values or ()]
    if not calls or any(call is None for call in calls):
        return Parsed(_content([text]), ())
    return Parsed(None, tuple(call for call in calls if call is not None))


def parse_mistral(text: str) -> Parsed:
    at = text.find(MISTRAL_MARKER)
    if at >= 0:
        before, body = text[:at], text[at + len(MISTRAL_MARKER) :]
    elif text.lstrip().startswith("["):
        before, body = "", text
    else:
        return Parsed(_content([text]), ())
    values = _json_values(body, "")
    items = [item for value in values or () for item in (value if isinstance(value, list) else [value])]
    calls = [_call(item, "arguments") for item in items]
    if not calls or any(call is None for call in calls):
        return Parsed(_content([text]), ())
    return Parsed(_content([before]), tuple(call for call in calls if call is not None))


PARSERS: dict[str, Callable[[str], Parsed]] = {
    HERMES: parse_hermes,
    LLAMA3: parse_llama3,
    MISTRAL: parse_mistral,
}


def parse(format_name: str, text: str) -> Parsed:
    return PARSERS[format_name](text)


def call_start(format_name: str, text: str) -> int:
    """Where a call may begin in ``text`` (len(text) when none can): text before it is plain content.

    A marker's unfinished prefix at the end holds the text back; for the JSON formats an answer
    that so far is only whitespace, or starts with ``{`` / ``[``, may be a call as a whole.
    """
    markers = {HERMES: (HERMES_OPEN,), LLAMA3: (PYTHON_TAG,), MISTRAL: (MISTRAL_MARKER,)}[format_name]
    leading = {HERMES: "", LLAMA3: "{<", MISTRAL: "[{"}[format_name]
    stripped = text.lstrip()
    if leading and (not stripped or stripped[0] in leading):
        return 0
    found = [text.find(marker) for marker in markers if marker in text]
    if found:
        return min(found)
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:size]):
                return len(text) - size
    return len(text)


def hermes_text(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """Earlier calls written as Hermes blocks (the fallback prompt's history)."""
    return "\n".join(
        f"{HERMES_OPEN}\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n{HERMES_CLOSE}"
        for n, a in calls
    )
