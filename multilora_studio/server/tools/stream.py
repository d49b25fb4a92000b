"""Streaming a tool-aware answer: plain text goes out as content, text that may be a call is held.

Content streams up to where a call may begin (formats.call_start); the rest is held until the
choice finishes, then parsed as a whole: the remaining content, then each call as OpenAI's
deltas (index, id, type and name first, then the arguments). Joined, the deltas equal the
non-streamed message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from multilora_studio.server.tools.formats import Parsed, call_start, parse


@dataclass
class ToolStream:
    format: str
    text: str = ""
    sent: int = 0  # characters of ``text`` already streamed as content
    parsed: Parsed | None = field(default=None, init=False)

    def feed(self, piece: str) -> str:
        """Content that can go out now."""
        self.text += piece
        safe = call_start(self.format, self.text)
        if safe <= self.sent or not self.text[:safe].strip():  # leading whitespace waits: it may be all
            return ""
        out, self.sent = self.text[self.sent : safe], safe
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """The content not yet sent and the calls' deltas, once the choice is done."""
        self.parsed = parse(self.format, self.text)
        content = self.parsed.content or ""
        rest = content[self.sent :] if content.startswith(self.text[: self.sent]) else ""
        deltas: list[dict[str, Any]] = []
        for index, call in enumerate(self.parsed.calls):
            head = {"name": call.name, "arguments": ""}
            deltas.append({"index": index, "id": call.id, "type": "function", "function": head})
            deltas.append({"index": index, "function": {"arguments": call.arguments}})
        return rest, deltas
