"""The FastAPI application: routes, error shape and guards around one engine."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from multilora_studio import __version__
from multilora_studio.server.config import ServerConfig
from multilora_studio.server.errors import install_error_handlers
from multilora_studio.server.middleware import ApiKeyAuth, BodyLimit, FramingCheck, HostCheck, RequestCap
from multilora_studio.server.routes_admin import admin_router
from multilora_studio.server.routes_admin import router as models_router
from multilora_studio.server.routes_generate import router as generate_router
from multilora_studio.server.routes_responses import router as responses_router
from multilora_studio.server.routes_tokenize import router as tokenize_router
from multilora_studio.server.routes_usage import usage_router
from multilora_studio.server.state import ServerState

EXTRA_REQUESTS = 64  # in progress beyond max_in_flight: /health, /metrics, /v1/models and the like

# Request headers a browser app may send from an allowed origin: the official openai JS
# client's (its x-stainless-* telemetry, OpenAI-Beta, idempotency keys) and the plain ones.
CORS_HEADERS = (
    "Authorization",
    "Content-Type",
    "Accept",
    "OpenAI-Organization",
    "OpenAI-Project",
    "OpenAI-Beta",
    "Idempotency-Key",
    "X-Stainless-Arch",
    "X-Stainless-Async",
    "X-Stainless-Helper-Method",
    "X-Stainless-Lang",
    "X-Stainless-OS",
    "X-Stainless-Package-Version",
    "X-Stainless-Poll-Helper",
    "X-Stainless-Retry-Count",
    "X-Stainless-Runtime",
    "X-Stainless-Runtime-Version",
    "X-Stainless-Timeout",
)


def create_app(config: ServerConfig, state: ServerState | None = None) -> FastAPI:
    """Outermost first: requests in progress, framing, Host check, CORS (only when origins are
    configured), API keys, body size. The routes read ``app.state.studio``: ``state``, or one
    set before the first request (an app built before its engines exist, as on Ray Serve)."""
    app = FastAPI(
        title="MultiLoRA Studio",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    if state is not None:
        app.state.studio = state
    app.include_router(generate_router)
    app.include_router(responses_router)
    app.include_router(models_router)
    app.include_router(admin_router)
    app.include_router(tokenize_router)
    app.include_router(usage_router)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.add_middleware(ApiKeyAuth, keys=config.keys)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=list(CORS_HEADERS),
        )
    app.add_middleware(HostCheck, names=config.host_names())
    app.add_middleware(FramingCheck)
    app.add_middleware(RequestCap, limit=config.max_in_flight + EXTRA_REQUESTS)
    return app
