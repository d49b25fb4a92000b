"""OpenAI response bodies and server-sent event streams built from a finished or running Job."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from multilora_studio.engine import TokenLogprob
from multilora_studio.server.generation import Choice, Job
from multilora_studio.server.logprob_shapes import (
    Scored,
    chat_logprobs,
    completion_logprobs,
    prompt_logprobs,
)
from multilora_studio.server.token_text import TokenNamer
from multilora_studio.server.tools.reply import tool_finish, tool_message
from multilora_studio.server.tools.stream import ToolStream

DONE = b"data: [DONE]\n\n"


def usage(job: Job) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens``: the prompt tokens the prefix cache held."""
    prompt, completion = job.prompt_tokens, job.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": job.cached_tokens},
    }


def _echo_text(job: Job, choice: Choice) -> str:
    """The prompt as given (text), or its ids decoded."""
    if isinstance(choice.prompt, str):
        return choice.prompt
    return job.token_text.text(choice.prompt_token_ids)


def _namer(job: Job) -> TokenNamer:
    return job.token_text.namer(job.options.token_ids)


def _prompt_scored(choice: Choice) -> list[Scored]:
    ids = choice.prompt_token_ids
    entries = choice.prompt_logprobs or (None,) * len(ids)
    return list(zip(ids, entries, strict=True))


def _generated_scored(entries: Sequence[TokenLogprob]) -> list[Scored]:
    return [(entry.token_id, entry) for entry in entries]


def _with_prompt_logprobs(job: Job, item: dict[str, Any], choice: Choice) -> dict[str, Any]:
    top = job.options.prompt_logprobs
    if top is None:
        return item
    entries = choice.prompt_logprobs or ()
    names = job.token_text.token
    return item | {"prompt_logprobs": prompt_logprobs(entries, top, names)}


def completion_body(job: Job) -> dict[str, Any]:
    options, name = job.options, _namer(job)
    choices = []
    for c in job.choices:
        echo = _echo_text(job, c) if options.echo else ""
        logprobs = None
        if options.logprobs is not None:
            scored = _generated_scored(c.logprobs)
            if options.echo:
                logprobs = completion_logprobs(_prompt_scored(c) + scored, options.logprobs, name, 0)
            else:
                logprobs = completion_logprobs(scored, options.logprobs, name, 0)
        text, reason = echo + c.text, c.finish_reason
        item = {"index": c.index, "text": text, "logprobs": logprobs, "finish_reason": reason}
        choices.append(_with_prompt_logprobs(job, item, c))
    return _envelope(job, "text_completion", choices) | {"usage": usage(job)}


def _chat_logprobs(job: Job, entries: Sequence[TokenLogprob]) -> dict[str, Any] | None:
    top = job.options.logprobs
    return None if top is None else chat_logprobs(entries, top, _namer(job))


def _chat_message(job: Job, choice: Choice) -> tuple[dict[str, Any], str | None]:
    if job.tool_format is None:
        return {"role": "assistant", "content": choice.text}, choice.finish_reason
    return tool_message(choice.text, job.tool_format, choice.finish_reason)


def chat_body(job: Job) -> dict[str, Any]:
    choices = []
    for c in job.choices:
        message, reason = _chat_message(job, c)
        item = {
            "index": c.index,
            "message": message,
            "logprobs": _chat_logprobs(job, c.logprobs),
            "finish_reason": reason,
        }
        choices.append(_with_prompt_logprobs(job, item, c))
    body = _envelope(job, "chat.completion", choices)
    if job.options.prompt_logprobs is not None:  # vLLM puts the chat prompt's scores at the top too
        body["prompt_logprobs"] = choices[0]["prompt_logprobs"]
    return body | {"usage": usage(job)}


def _envelope(job: Job, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": job.id, "object": kind, "created": job.created, "model": job.model, "choices": choices}


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def completion_events(job: Job, include_usage: bool) -> AsyncIterator[bytes]:
    """One chunk per delta with text or tokens; a choice's first chunk carries the echo and prompt scores."""
    options, name = job.options, _namer(job)
    offsets: dict[int, int] = {}  # choice index -> the next token's text_offset, once it has a chunk
    async for choice, delta in job.deltas():
        if job.error is not None:
            break
        text, scored = delta.text, _generated_scored(delta.logprobs)
        if choice.index not in offsets and options.echo:
            text = _echo_text(job, choice) + text
            scored = _prompt_scored(choice) + scored
        if not (text or delta.finished or scored or delta.prompt_logprobs is not None):
            continue
        offset = offsets.get(choice.index, 0)
        logprobs = None
        if options.logprobs is not None:
            logprobs = completion_logprobs(scored, options.logprobs, name, offset)
            offset += sum(len(token) for token in logprobs["tokens"])  # as in the whole answer
        offsets[choice.index] = offset
        reason = choice.finish_reason if delta.finished else None
        item = {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": reason}
        if delta.prompt_logprobs is not None:
            item = _with_prompt_logprobs(job, item, choice)
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
    held = {c.index: ToolStream(job.tool_format) for c in job.choices} if job.tool_format else {}
    async for choice, delta in job.deltas():
        if job.error is not None:
            break
        logprobs = _chat_logprobs(job, delta.logprobs) if delta.logprobs else None
        text = held[choice.index].feed(delta.text) if held else delta.text
        if text or logprobs is not None or delta.prompt_logprobs is not None:
            item = {
                "index": choice.index,
                "delta": {"content": text},
                "logprobs": logprobs,
                "finish_reason": None,
            }
            if delta.prompt_logprobs is not None:
                item = _with_prompt_logprobs(job, item, choice)
            yield sse(_envelope(job, kind, [item]))
        if delta.finished:
            reason = choice.finish_reason
            if held:
                rest, calls = held[choice.index].finish()
                pieces = ([{"content": rest}] if rest else []) + [{"tool_calls": [call]} for call in calls]
                for piece in pieces:
                    item = {"index": choice.index, "delta": piece, "logprobs": None, "finish_reason": None}
                    yield sse(_envelope(job, kind, [item]))
                reason = tool_finish(len(calls), reason)
            item = {"index": choice.index, "delta": {}, "logprobs": None, "finish_reason": reason}
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
