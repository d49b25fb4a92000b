"""The assistant message of a tool-aware answer: the text outside the calls, the calls, the finish reason."""

from __future__ import annotations

from typing import Any

from multilora_studio.server.tools.formats import parse


def tool_message(text: str, format_name: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """OpenAI's message and finish reason ("tool_calls" when the answer holds calls)."""
    parsed = parse(format_name, text)
    if not parsed.calls:
        return {"role": "assistant", "content": text}, finish_reason
    calls = [call.openai() for call in parsed.calls]
    return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, tool_finish(
        1, finish_reason
    )


def tool_finish(calls: int, reason: str | None) -> str | None:
    """A choice that made calls finishes with "tool_calls"."""
    return "tool_calls" if calls else reason
