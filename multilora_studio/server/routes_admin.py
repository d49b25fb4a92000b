"""Models, adapter loading (vLLM's routes), health and Prometheus metrics."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from multilora_studio import __version__
from multilora_studio.adapters.peft_adapter import CONFIG_FILE
from multilora_studio.server.errors import ApiError
from multilora_studio.server.schemas import LoadLoraRequest, UnloadLoraRequest
from multilora_studio.server.state import ServerState, caller, require_admin, server_state

router = APIRouter()
admin_router = APIRouter(dependencies=[Depends(require_admin)])  # routes only admin keys may call
OWNER = "multilora-studio"


def model_cards(state: ServerState, request: Request) -> list[dict[str, Any]]:
    """The base model and every adapter the caller's key may use; adapters name the base as
    ``parent`` (vLLM's shape).

    ``root`` is a name (the base's, an adapter's own), never a folder: any key holder reads this.
    """
    engine = state.engine
    base = engine.model_name
    common = {"object": "model", "created": state.created, "owned_by": OWNER}
    max_len = engine.config.max_model_len
    cards = [{"id": base, **common, "root": base, "parent": None, "max_model_len": max_len}]
    for info in sorted(engine.list_adapters(), key=lambda a: a.name):
        cards.append({"id": info.name, **common, "root": info.name, "parent": base, "max_model_len": max_len})
    key = caller(request)
    return [card for card in cards if key.may_use(str(card["id"]))]


@router.get("/health")
async def health() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": __version__})


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": model_cards(server_state(request), request)})


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> JSONResponse:
    for card in model_cards(server_state(request), request):
        if card["id"] == model:
            return JSONResponse(card)
    raise ApiError(404, f"The model `{model}` does not exist.", "model_not_found", "model")


def _no_adapter_at(path: str) -> ApiError:
    """One answer for a missing path, a file, an unreadable folder or one without adapter_config.json,
    so the route tells nobody which paths exist on the server."""
    return ApiError(
        400,
        f"no adapter at {path} (a readable folder with {CONFIG_FILE} is needed)",
        "invalid_adapter",
        "lora_path",
    )


def _has_adapter_config(path: str) -> bool:
    config = Path(path) / CONFIG_FILE
    try:
        return config.is_file() and os.access(config, os.R_OK)
    except (OSError, ValueError):  # a name too long, a NUL byte
        return False


@admin_router.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoraRequest, request: Request) -> PlainTextResponse:
    engine = server_state(request).engine
    taken = any(info.name == body.lora_name for info in engine.list_adapters())  # the engine says so
    if not taken and not await asyncio.to_thread(_has_adapter_config, body.lora_path):
        raise _no_adapter_at(body.lora_path)
    try:
        await asyncio.to_thread(engine.add_adapter, body.lora_name, body.lora_path)
    except OSError:
        raise _no_adapter_at(body.lora_path) from None
    except ValueError as error:
        raise ApiError(
            400, f"could not load adapter {body.lora_name!r}: {error}", "invalid_adapter"
        ) from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@admin_router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraRequest, request: Request) -> PlainTextResponse:
    engine = server_state(request).engine
    if not any(info.name == body.lora_name for info in engine.list_adapters()):
        raise ApiError(404, f"The adapter `{body.lora_name}` does not exist.", "model_not_found", "lora_name")
    try:
        await asyncio.to_thread(engine.remove_adapter, body.lora_name)
    except ValueError as error:  # still in use by queued or running requests
        raise ApiError(
            409, f"could not unload adapter {body.lora_name!r}: {error}", "adapter_in_use"
        ) from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


@admin_router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(server_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
