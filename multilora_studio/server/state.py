"""What the routes share: the engine, the limits, the metrics, the request log and the live jobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fastapi import Request

from multilora_studio.engine import Engine
from multilora_studio.server.api_keys import ANONYMOUS, ApiKey
from multilora_studio.server.config import ServerConfig
from multilora_studio.server.errors import ApiError
from multilora_studio.server.hub_resolver import HubResolver
from multilora_studio.server.limits import Admission
from multilora_studio.server.metrics import ServerMetrics
from multilora_studio.server.request_log import RequestLog
from multilora_studio.server.token_text import TokenText

API_KEY_SCOPE = "multilora.api_key"  # set by the auth middleware: the caller's ApiKey


class LiveJob(Protocol):
    """What the server needs of a live job (``generation.Job``) when it stops."""

    def abort(self) -> None: ...


@dataclass
class ServerState:
    engine: Engine
    config: ServerConfig
    admission: Admission
    metrics: ServerMetrics
    request_log: RequestLog
    created: int
    hub: HubResolver | None = None  # set: unknown ``org/name[@rev]`` models are pulled from the Hub
    jobs: set[LiveJob] = field(default_factory=set)
    token_text: TokenText = field(init=False)  # the base model's
    _adapter_texts: dict[int, TokenText] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.token_text = TokenText(self.engine.tokenizer)

    def token_text_for(self, adapter: str | None) -> TokenText:
        """Token texts from ``adapter``'s own tokenizer where it has one, else the base's."""
        tokenizer = self.engine.tokenizer_for(adapter)
        if tokenizer is self.engine.tokenizer:
            return self.token_text
        return self._adapter_texts.setdefault(id(tokenizer), TokenText(tokenizer))

    async def resolve_model(self, model: str, caller: ApiKey) -> str | None:
        """The adapter that ``model`` names (None: the base model); 404 for anything else.

        A model the caller's key may not use is a 404 too, as if it did not exist. With Hub
        adapters on, an unknown ``org/name[@rev]`` is pulled and served first.
        """
        if not caller.may_use(model):
            raise ApiError(404, f"The model `{model}` does not exist.", "model_not_found", "model")
        if model == self.engine.model_name:
            return None
        if any(info.name == model for info in self.engine.list_adapters()):
            return model
        if self.hub is not None:
            return await self.hub.resolve(model)
        raise ApiError(404, f"The model `{model}` does not exist.", "model_not_found", "model")

    def abort_all(self) -> None:
        """End every job's engine requests (the server is stopping); call on the server's loop."""
        for job in list(self.jobs):
            job.abort()


def server_state(request: Request) -> ServerState:
    return request.app.state.studio


def caller(request: Request) -> ApiKey:
    """The key the request came with (every caller is an anonymous admin when no key is set)."""
    return request.scope.get(API_KEY_SCOPE, ANONYMOUS)


def api_key_label(request: Request) -> str:
    return caller(request).name


def require_admin(request: Request) -> None:
    """403 unless the caller's key is an admin key."""
    if not caller(request).admin:
        message = "this API key may only generate: loading, unloading and metrics need an admin key"
        raise ApiError(403, message, "permission_denied")
