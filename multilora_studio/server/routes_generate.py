"""``/v1/completions`` and ``/v1/chat/completions``, streaming and not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from multilora_studio.engine import Prompt, SamplingParams, ServingEngine
from multilora_studio.server.errors import ApiError
from multilora_studio.server.generation import CLIENT_GONE, Job, record_rejection
from multilora_studio.server.request_fields import check_fields
from multilora_studio.server.responses import (
    EventStream,
    chat_body,
    chat_events,
    completion_body,
    completion_events,
)
from multilora_studio.server.sampling import (
    chat_max_tokens,
    chat_max_tokens_field,
    chat_prompt,
    check_supported,
    completion_prompts,
    sampling_params,
    score_options,
)
from multilora_studio.server.schemas import ChatCompletionRequest, CompletionRequest
from multilora_studio.server.state import ServerState, api_key_label, caller, server_state
from multilora_studio.server.tools.setup import tool_plan, uses_tools, with_tool_structure

router = APIRouter()


Prepare = Callable[[ServingEngine, str | None], tuple[list[Prompt], list[SamplingParams]]]


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    def prepare(engine: ServingEngine, adapter: str | None) -> tuple[list[Prompt], list[SamplingParams]]:
        prompts = completion_prompts(body)
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        tokenizer = engine.tokenizer_for(adapter)
        params = sampling_params(body, max_tokens, tokenizer)
        return prompts, params

    return await generate(
        request, "completions", body, prepare, completion_body, completion_events, "max_tokens"
    )


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state = server_state(request)
    tool_format: list[str | None] = [None]  # prepare() sets it: the format answers are parsed in

    def prepare(engine: ServingEngine, adapter: str | None) -> tuple[list[Prompt], list[SamplingParams]]:
        tokenizer = engine.tokenizer_for(adapter)  # its own template, where it brings one
        if not uses_tools(body):
            return chat_request(body, engine.config.max_model_len, tokenizer)
        max_tokens = chat_max_tokens(body, engine.config.max_model_len)
        params = sampling_params(body, max_tokens, tokenizer)
        specials = state.config.allow_special_tokens_in_content
        plan = tool_plan(body, tokenizer, engine.renderer_for(adapter), engine.spec.model_type, specials)
        tool_format[0] = plan.format
        return [plan.token_ids], with_tool_structure(params, plan.structure)

    def chat_job(job: Job) -> None:
        job.tool_format = tool_format[0]

    return await generate(
        request, "chat", body, prepare, chat_body, chat_events, chat_max_tokens_field(body), chat_job
    )


def chat_request(
    body: ChatCompletionRequest, max_model_len: int, tokenizer: Any
) -> tuple[list[Prompt], list[SamplingParams]]:
    """The engine prompt and the parameters of each choice of a chat request."""
    max_tokens = chat_max_tokens(body, max_model_len)
    params = sampling_params(body, max_tokens, tokenizer)
    return [chat_prompt(body.messages)], params


async def generate(
    request: Request,
    route: str,
    body: CompletionRequest | ChatCompletionRequest,
    prepare: Prepare,
    build_body: Callable[[Job], dict[str, Any]],
    build_events: Callable[[Job, bool], AsyncIterator[bytes]],
    max_tokens_field: str | None,
    configure: Callable[[Job], None] | None = None,
) -> Response:
    """Run one generation request; ``max_tokens_field`` names the field that set the output cap.

    ``prepare`` (templates, tokenizers, grammar checks: work that grows with the request) runs on
    a worker thread, never on the event loop."""
    state, key = server_state(request), api_key_label(request)
    try:
        state.admission.check_room(key)  # a key at its limit is refused before any work
        target = await state.resolve_model(body.model, caller(request))
        check_supported(body)
        check_fields(route, body)
        engine = await state.lease(target)  # the base loads first if it was swapped out
    except ApiError as error:
        await refuse(state, route, body, key, error)
        raise
    try:
        prompts, params = await asyncio.to_thread(prepare, engine, target.adapter)
        job = Job(
            state,
            route,
            body.model,
            target,
            engine,
            key,
            body.stream,
            prompts,
            params,
            score_options(body),
            max_tokens_field,
        )
    except BaseException as error:
        state.release(target)
        if isinstance(error, ApiError):
            await refuse(state, route, body, key, error)
        raise
    if configure is not None:
        configure(job)
    try:
        await job.submit()
    except ApiError as error:
        job.error = error
        job.close()
        raise
    except BaseException:
        job.close(status=500)
        raise
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStream(build_events(job, include_usage), job.close)
    try:
        if not await job.run_to_end(request.receive):
            job.close(client_gone=True)
            return Response(status_code=CLIENT_GONE)
        if job.error is not None:
            raise job.error
        return JSONResponse(build_body(job))
    finally:
        job.close()


async def refuse(
    state: ServerState, route: str, body: CompletionRequest | ChatCompletionRequest, key: str, error: ApiError
) -> None:
    """Log a request refused before any engine work; hold the answer to a key that came back
    before its ``Retry-After`` (``Admission.hold_refusal``)."""
    record_rejection(state, route, body.model, key, body.stream, error)
    await state.admission.hold_refusal(key, error)
