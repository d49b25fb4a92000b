"""vLLM's ``/tokenize`` and ``/detokenize`` and ``GET /tokenizer_info`` (what lm-evaluation-harness probes).

At the server root, not under /v1, as vLLM serves them. ``model`` (optional) picks the
adapter whose own tokenizer and template apply (the base's otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from multilora_studio.engine import ServingEngine
from multilora_studio.engine.text.chat_tokens import Render, chat_token_ids
from multilora_studio.server.errors import ApiError
from multilora_studio.server.prompt_errors import prompt_error
from multilora_studio.server.sampling import chat_prompt
from multilora_studio.server.schemas import DetokenizeRequest, TokenizeRequest
from multilora_studio.server.state import ModelTarget, ServerState, api_key_label, caller, server_state

router = APIRouter()


def _tokenizer(engine: ServingEngine, adapter: str | None) -> Any:
    tokenizer = engine.tokenizer_for(adapter)
    if tokenizer is None:
        raise ApiError(404, "this model has no tokenizer; send token ids", "tokenizer_not_found")
    return tokenizer


async def _target(state: ServerState, request: Request, model: str | None) -> ModelTarget:
    """What ``model`` names (without one: the first base), if the caller's key may use it; a 404
    naming ``model`` otherwise, so a key limited to some models reaches no other tokenizer."""
    key = caller(request)
    if model is not None:
        return await state.resolve_model(model, key)
    if not key.may_use(state.pool.primary):
        message = "this API key may not use the default model: name one of its models in `model`"
        raise ApiError(404, message, "model_not_found", "model")
    return ModelTarget(state.pool.primary, None)


@contextlib.asynccontextmanager
async def _admitted(
    state: ServerState, request: Request, model: str | None
) -> AsyncIterator[tuple[ServingEngine, str | None]]:
    """The caller's per-key limits apply as to generation (no engine request, no tokens charged);
    yields the engine of the base ``model`` names (``_target``) and the adapter (None: the base
    model)."""
    target = await _target(state, request, model)
    key = api_key_label(request)
    state.admission.acquire(key, 0)  # no tokens: nothing generated
    try:
        async with state.leased(target) as engine:
            yield engine, target.adapter
    finally:
        state.admission.release(key, 0, 0, 0)


def _encode(
    tokenizer: Any, render: Render, body: TokenizeRequest, special_tokens_in_content: bool
) -> list[int]:
    if body.messages is not None:
        return chat_token_ids(
            tokenizer,
            chat_prompt(body.messages),
            special_tokens_in_content,
            bool(body.add_special_tokens),
            render,
            add_generation_prompt=body.add_generation_prompt,
        )
    special = True if body.add_special_tokens is None else body.add_special_tokens
    return list(tokenizer(body.prompt, add_special_tokens=special).input_ids)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> JSONResponse:
    state = server_state(request)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "send either `prompt` or `messages`", "invalid_value", "prompt")
    async with _admitted(state, request, body.model) as (engine, adapter):
        tokenizer = _tokenizer(engine, adapter)
        if body.messages is not None and not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "this model has no chat template; send a prompt", "invalid_value", "messages")
        try:
            specials = state.config.allow_special_tokens_in_content
            render = engine.renderer_for(adapter)
            tokens = await asyncio.to_thread(_encode, tokenizer, render, body, specials)
        except ApiError:
            raise
        except Exception as error:  # the chat template can refuse a conversation (jinja errors)
            field = "messages" if body.messages is not None else "prompt"
            raise prompt_error(error, field) from None
        names = state.token_text_for(engine, adapter)
        max_model_len = engine.config.max_model_len
    answer: dict[str, Any] = {
        "count": len(tokens),
        "max_model_len": max_model_len,
        "tokens": tokens,
        "token_strs": [names.token(t) for t in tokens] if body.return_token_strs else None,
    }
    return JSONResponse(answer)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> JSONResponse:
    state = server_state(request)
    async with _admitted(state, request, body.model) as (engine, adapter):
        tokenizer = _tokenizer(engine, adapter)
        vocab = engine.vocab_size_of(adapter)
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise ApiError(400, f"token ids out of range [0, {vocab}): {bad[:5]}", "invalid_value", "tokens")
        text = await asyncio.to_thread(tokenizer.decode, body.tokens)
    return JSONResponse({"prompt": text})


def _token_name(token: Any) -> str | None:
    return None if token is None else str(token)


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request, model: str | None = None) -> JSONResponse:
    """The tokenizer's special tokens and chat template (vLLM's route; lm-eval's remote tokenizer):
    the first base's, or ``?model=``'s (an adapter's own where it brings one)."""
    state = server_state(request)
    target = await _target(state, request, model)
    async with state.leased(target) as engine:
        tokenizer = _tokenizer(engine, target.adapter)
        max_model_len, vocab_size = engine.config.max_model_len, engine.vocab_size_of(target.adapter)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    return JSONResponse(
        {
            "tokenizer_class": type(tokenizer).__name__,
            "eos_token": _token_name(tokenizer.eos_token),
            "bos_token": _token_name(tokenizer.bos_token),
            "pad_token": _token_name(tokenizer.pad_token),
            "unk_token": _token_name(tokenizer.unk_token),
            "chat_template": template,
            "model_max_length": max_model_len,
            "vocab_size": vocab_size,
        }
    )
