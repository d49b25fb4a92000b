"""``GET /v1/usage``: requests, tokens, latency, cold starts and engine time by tenant and model
(admin keys only), as JSON or CSV; in the JSON, each base's load quantiles and each adapter's
(``adapters``: its disk -> host reads and host -> GPU uploads, counted, with p50 / p95)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from multilora_studio.engine.serving_engine import metrics_of
from multilora_studio.server.errors import ApiError
from multilora_studio.server.state import require_admin, server_state
from multilora_studio.server.usage import rows_csv, trace_lines

usage_router = APIRouter(dependencies=[Depends(require_admin)])


@usage_router.get("/v1/usage/trace")
async def usage_trace(
    request: Request,
    since: float | None = Query(None, description="Unix time (seconds): only requests from then on"),
) -> Response:
    """Every request held (the last 100,000), one JSON object a line: the recorded traffic."""
    if since is not None and not math.isfinite(since):
        raise ApiError(400, "since must be a Unix time in seconds", "invalid_value", "since")
    return PlainTextResponse(
        trace_lines(server_state(request).usage.records(since)), media_type="application/x-ndjson"
    )


@usage_router.get("/v1/usage")
async def usage(
    request: Request,
    since: float | None = Query(None, description="Unix time (seconds): only requests from then on"),
    output_format: str = Query("json", alias="format", pattern="^(json|csv)$"),
) -> Response:
    if since is not None and not math.isfinite(since):
        raise ApiError(400, "since must be a Unix time in seconds", "invalid_value", "since")
    state = server_state(request)
    rows = state.usage.rows(since)
    if output_format == "csv":
        return PlainTextResponse(rows_csv(rows), media_type="text/csv")
    bases: list[dict[str, Any]] = []
    adapters: list[dict[str, Any]] = []
    for name, engine in state.pool.resident():
        snap = metrics_of(engine)
        if snap is not None:
            adapters.extend({"base": name, **dataclasses.asdict(loads)} for loads in snap.adapter_loads)
            bases.append(
                {
                    "base": name,
                    "busy_seconds": snap.busy_seconds,
                    "cold_load_disk_to_host_p50_s": snap.cold_load_p50_s,
                    "cold_load_disk_to_host_p95_s": snap.cold_load_p95_s,
                    "upload_host_to_gpu_p50_s": snap.upload_p50_s,
                    "upload_host_to_gpu_p95_s": snap.upload_p95_s,
                    "disk_loads": snap.cpu_misses,
                }
            )
    return JSONResponse(
        {
            "object": "usage",
            "since": since,
            "complete": state.usage.complete_since(since),
            "data": [dataclasses.asdict(row) for row in rows],
            "bases": bases,
            "adapters": adapters,
        }
    )
