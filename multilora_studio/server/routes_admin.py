"""Models, adapter loading (vLLM's routes), health and Prometheus metrics."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from multilora_studio import __version__
from multilora_studio.adapters.peft_adapter import CONFIG_FILE
from multilora_studio.deploy import BaseUnavailable
from multilora_studio.server.errors import ApiError
from multilora_studio.server.schemas import LoadLoraRequest, UnloadLoraRequest
from multilora_studio.server.state import ServerState, caller, require_admin, server_state

router = APIRouter()
admin_router = APIRouter(dependencies=[Depends(require_admin)])  # routes only admin keys may call
OWNER = "multilora-studio"


def model_cards(state: ServerState, request: Request) -> list[dict[str, Any]]:
    """Every base model and every adapter the caller's key may use; adapters name their base as
    ``parent`` (vLLM's shape). A base that is swapped out is listed with what it serves.

    ``root`` is a name (the base's, an adapter's own), never a folder: any key holder reads this.
    """
    common = {"object": "model", "created": state.created, "owned_by": OWNER}
    resident = dict(state.pool.resident())
    cards = []
    for base in state.pool.names:
        engine = resident.get(base)
        max_len = (engine.config if engine is not None else state.pool.base(base).config).max_model_len
        cards.append({"id": base, **common, "root": base, "parent": None, "max_model_len": max_len})
        for name in sorted(state.pool.adapters_of(base)):
            cards.append({"id": name, **common, "root": name, "parent": base, "max_model_len": max_len})
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
    state = server_state(request)
    pool = state.pool
    base = body.base_model or pool.primary
    if base not in pool.names:
        raise ApiError(404, f"The base model `{base}` does not exist.", "model_not_found", "base_model")
    taken = pool.base_of(body.lora_name) is not None
    if not taken and not await state.adapter_call(_has_adapter_config, body.lora_path):
        raise _no_adapter_at(body.lora_path)
    try:
        await state.adapter_call(pool.add_adapter, base, body.lora_name, Path(body.lora_path))
    except OSError:
        raise _no_adapter_at(body.lora_path) from None
    except BaseUnavailable as error:
        raise ApiError(503, str(error), "model_unavailable", "base_model") from None
    except ValueError as error:
        raise ApiError(
            400, f"could not load adapter {body.lora_name!r}: {error}", "invalid_adapter"
        ) from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@admin_router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraRequest, request: Request) -> PlainTextResponse:
    state = server_state(request)
    pool = state.pool
    found = pool.base_of(body.lora_name)
    if found is None or found[1] is None:
        raise ApiError(404, f"The adapter `{body.lora_name}` does not exist.", "model_not_found", "lora_name")
    try:
        await state.adapter_call(pool.remove_adapter, body.lora_name)
    except BaseUnavailable as error:
        raise ApiError(503, str(error), "model_unavailable", "lora_name") from None
    except ValueError as error:  # still in use by queued or running requests
        raise ApiError(
            409, f"could not unload adapter {body.lora_name!r}: {error}", "adapter_in_use"
        ) from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


@admin_router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(server_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)
