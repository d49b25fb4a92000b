"""Responses API bodies and event streams (``/v1/responses``) built from a chat Job."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from multilora_studio.server.generation import Job


@dataclass(frozen=True)
class Settings:
    """The request values a response object repeats."""

    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None


def _usage(job: Job) -> dict[str, Any]:
    prompt, output = job.prompt_tokens, job.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": job.cached_tokens},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(item_id: str, text: str | None) -> dict[str, Any]:
    """The assistant message item; ``text`` None: still being written (no content yet)."""
    content = [] if text is None else [_text_part(text)]
    status = "in_progress" if text is None else "completed"
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _response(job: Job, settings: Settings, output: list[dict[str, Any]], done: bool) -> dict[str, Any]:
    choice = job.choices[0]
    status, incomplete = "in_progress", None
    if done:
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": job.id,
        "object": "response",
        "created_at": job.created,
        "status": status,
        "model": job.model,
        "output": output,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": settings.instructions,
        "max_output_tokens": settings.max_output_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": {},
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "background": False,
        "usage": _usage(job) if done else None,
    }


def _item_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def response_body(settings: Settings, job: Job) -> dict[str, Any]:
    """The whole response object of a finished job."""
    return _response(job, settings, [_message(_item_id(), job.choices[0].text)], done=True)


async def response_events(settings: Settings, job: Job, include_usage: bool) -> AsyncIterator[bytes]:
    """OpenAI's Responses streaming events; each carries its ``type`` and ``sequence_number``.

    ``include_usage`` is unused: the final response object always carries usage.
    """
    del include_usage
    sequence = 0

    def event(kind: str, **fields: Any) -> bytes:
        nonlocal sequence
        payload = {"type": kind, "sequence_number": sequence, **fields}
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

    item_id = _item_id()
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    yield event("response.created", response=_response(job, settings, [], done=False))
    yield event("response.in_progress", response=_response(job, settings, [], done=False))
    yield event("response.output_item.added", output_index=0, item=_message(item_id, None))
    yield event("response.content_part.added", **where, part=_text_part(""))
    async for _, delta in job.deltas():
        if job.error is not None:
            error = job.error
            yield event("error", code=error.code, message=error.message, param=error.param)
            return
        if delta.text:
            yield event("response.output_text.delta", **where, delta=delta.text, logprobs=[])
    text = job.choices[0].text
    yield event("response.output_text.done", **where, text=text, logprobs=[])
    yield event("response.content_part.done", **where, part=_text_part(text))
    item = _message(item_id, text)
    yield event("response.output_item.done", output_index=0, item=item)
    final = _response(job, settings, [item], done=True)
    yield event(
        f"response.{'incomplete' if final['status'] == 'incomplete' else 'completed'}", response=final
    )
