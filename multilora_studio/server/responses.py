"""OpenAI response bodies and server-sent event streams built from a finished or running Job."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from multilora_studio.server.generation import Job

DONE = b"data: [DONE]\n\n"


def usage(job: Job) -> dict[str, int]:
    prompt, completion = job.prompt_tokens, job.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(job: Job) -> dict[str, Any]:
    choices = [
        {"index": c.index, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
        for c in job.choices
    ]
    return _envelope(job, "text_completion", choices) | {"usage": usage(job)}


def chat_body(job: Job) -> dict[str, Any]:
    choices = [
        {
            "index": c.index,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": None,
            "finish_reason": c.finish_reason,
        }
        for c in job.choices
    ]
    return _envelope(job, "chat.completion", choices) | {"usage": usage(job)}


def _envelope(job: Job, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": job.id, "object": kind, "created": job.created, "model": job.model, "choices": choices}


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def completion_events(job: Job, include_usage: bool) -> AsyncIterator[bytes]:
    async for choice, delta in job.deltas():
        if job.error is not None:
            break
        if delta.text or delta.finished:
            reason = choice.finish_reason if delta.finished else None
            item = {"index": choice.index, "text": delta.text, "logprobs": None, "finish_reason": reason}
            yield sse(_envelope(job, "text_completion", [item]))
    async for tail in _tail(job, "text_completion", include_usage):
        yield tail


async def chat_events(job: Job, include_usage: bool) -> AsyncIterator[bytes]:
    kind = "chat.completion.chunk"
    for choice in job.choices:
        first = {"role": "assistant", "content": ""}
        yield sse(
            _envelope(
                job, kind, [{"index": choice.index, "delta": first, "logprobs": None, "finish_reason": None}]
            )
        )
    async for choice, delta in job.deltas():
        if job.error is not None:
            break
        if delta.text:
            item = {
                "index": choice.index,
                "delta": {"content": delta.text},
                "logprobs": None,
                "finish_reason": None,
            }
            yield sse(_envelope(job, kind, [item]))
        if delta.finished:
            item = {
                "index": choice.index,
                "delta": {},
                "logprobs": None,
                "finish_reason": choice.finish_reason,
            }
            yield sse(_envelope(job, kind, [item]))
    async for tail in _tail(job, kind, include_usage):
        yield tail


async def _tail(job: Job, kind: str, include_usage: bool) -> AsyncIterator[bytes]:
    if job.error is not None:
        yield sse(job.error.body())
    elif include_usage:
        yield sse(_envelope(job, kind, []) | {"usage": usage(job)})
    yield DONE


class EventStream(StreamingResponse):
    """An SSE response that stops as soon as the client disconnects and always calls ``on_close``.

    ``on_close(client_gone=...)`` runs exactly once, however the stream ends: completed,
    client gone, or cancelled by a server shutdown.
    """

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[..., None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        completed = False
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    nonlocal completed
                    await self.stream_response(send)
                    completed = True
                    group.cancel_scope.cancel()

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                group.start_soon(watch)
        finally:
            self.on_close(client_gone=not completed)
