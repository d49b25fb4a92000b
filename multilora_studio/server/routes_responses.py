"""``POST /v1/responses``: OpenAI's Responses API (text only), run as the chat request it means."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import Response

from multilora_studio.engine import Prompt, SamplingParams, ServingEngine
from multilora_studio.server.errors import ApiError
from multilora_studio.server.generation import record_rejection
from multilora_studio.server.request_fields import RESPONSES, check_fields
from multilora_studio.server.responses_api import Settings, response_body, response_events
from multilora_studio.server.responses_request import ResponsesRequest, as_chat
from multilora_studio.server.routes_generate import chat_request, generate
from multilora_studio.server.state import api_key_label, server_state

router = APIRouter()


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    state = server_state(request)
    try:
        chat = as_chat(body)
    except ApiError as error:
        record_rejection(state, RESPONSES, body.model, api_key_label(request), body.stream, error)
        raise

    def prepare(engine: ServingEngine, adapter: str | None) -> tuple[list[Prompt], list[SamplingParams]]:
        check_fields(RESPONSES, body)
        return chat_request(chat, engine.config.max_model_len, engine.tokenizer_for(adapter))

    settings = Settings(body.instructions, body.max_output_tokens, body.temperature, body.top_p)
    return await generate(
        request,
        RESPONSES,
        chat,
        prepare,
        partial(response_body, settings),
        partial(response_events, settings),
        "max_output_tokens" if body.max_output_tokens else None,
    )
