"""What the routes share: the base models' engines, the limits, the metrics, the request log and
the live jobs."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fastapi import Request

from multilora_studio.deploy import BasePool, BaseUnavailable
from multilora_studio.engine import ServingEngine
from multilora_studio.server.api_keys import ANONYMOUS, ApiKey
from multilora_studio.server.config import ServerConfig
from multilora_studio.server.errors import ApiError
from multilora_studio.server.hub_resolver import HubResolver
from multilora_studio.server.limits import Admission
from multilora_studio.server.metrics import ServerMetrics
from multilora_studio.server.request_log import RequestLog, RequestRecord
from multilora_studio.server.token_text import TokenText
from multilora_studio.server.usage import UNKNOWN_MODEL, UsageLedger

API_KEY_SCOPE = "multilora.api_key"  # set by the auth middleware: the caller's ApiKey
T = TypeVar("T")
ADAPTER_CALLS_AT_ONCE = 2  # runtime adapter loads and unloads running at once, on threads of their own


class LiveJob(Protocol):
    """What the server needs of a live job (``generation.Job``) when it stops."""

    def abort(self) -> None: ...


@dataclass(frozen=True)
class ModelTarget:
    """What a request's ``model`` names: a base of the pool, and one of its adapters (None: the
    base); ``alias``: the alias it named the adapter by, if it did."""

    base: str
    adapter: str | None
    alias: str | None = None


@dataclass
class ServerState:
    pool: BasePool
    config: ServerConfig
    admission: Admission
    metrics: ServerMetrics
    request_log: RequestLog
    usage: UsageLedger
    created: int
    hub: HubResolver | None = None  # set: unknown ``org/name[@rev]`` models are pulled from the Hub
    jobs: set[LiveJob] = field(default_factory=set)
    # each tokenizer's token texts (a swapped-out base's go with its tokenizer)
    _token_texts: weakref.WeakKeyDictionary[Any, TokenText] = field(
        init=False, default_factory=weakref.WeakKeyDictionary
    )
    _adapter_threads: ThreadPoolExecutor = field(
        init=False,
        default_factory=lambda: ThreadPoolExecutor(ADAPTER_CALLS_AT_ONCE, thread_name_prefix="adapter-call"),
    )

    async def adapter_call(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` (loading or removing an adapter at runtime) on the adapter threads, so
        that slow loads never hold the shared pool every request's tokenizing runs on."""
        return await asyncio.get_running_loop().run_in_executor(self._adapter_threads, work, *args)

    def record(self, record: RequestRecord) -> None:
        """A finished or refused request, into the request log and the usage ledger."""
        self.request_log.add(record)
        served = record.status != 404 and self.pool.base_of(record.model) is not None
        self.usage.add(record, served)

    def served_label(self, model: str) -> str:
        """``model`` as a label of metrics series: a name the server serves (a base, an adapter,
        an alias), else ``unknown``, so no caller can add series."""
        return model if self.pool.base_of(model) is not None else UNKNOWN_MODEL

    def token_text_for(self, engine: ServingEngine, adapter: str | None) -> TokenText:
        """Token texts from ``adapter``'s own tokenizer where it has one, else its base's."""
        tokenizer = engine.tokenizer_for(adapter)
        if tokenizer is None:
            return TokenText(None)
        texts = self._token_texts.get(tokenizer)
        if texts is None:
            texts = self._token_texts[tokenizer] = TokenText(tokenizer)
        return texts

    async def resolve_model(self, model: str, caller: ApiKey) -> ModelTarget:
        """The base and adapter that ``model`` names; 404 for anything else.

        A model the caller's key may not use is a 404 too, as if it did not exist. With Hub
        adapters on, an unknown ``org/name[@rev]`` named by an admin key (every caller when no key
        is set) is pulled and served (on the first base) first.
        """
        if not caller.may_use(model):
            raise ApiError(404, f"The model `{model}` does not exist.", "model_not_found", "model")
        found = self.pool.base_of(model)
        if found is not None:
            base, adapter = found
            return ModelTarget(base, adapter, model if adapter not in (None, model) else None)
        if self.hub is not None and caller.admin:
            return ModelTarget(self.pool.primary, await self.hub.resolve(model))
        raise ApiError(404, f"The model `{model}` does not exist.", "model_not_found", "model")

    async def lease(self, target: ModelTarget) -> ServingEngine:
        """The engine of ``target``'s base, loaded and kept loaded until ``release(target)``;
        503 when it cannot be loaded in time. A request cancelled while it waits leaves no lease.
        A request by an alias starts reading the alias's warm list on its first use there
        (``BasePool.warm_alias``)."""
        task = asyncio.ensure_future(asyncio.to_thread(self.pool.acquire, target.base))
        try:
            engine = await asyncio.shield(task)
        except BaseUnavailable as error:
            raise ApiError(503, str(error), "model_unavailable", "model") from None
        except asyncio.CancelledError:
            task.add_done_callback(lambda done: self._release_if_acquired(target, done))
            raise
        if target.alias is not None:
            self.pool.warm_alias(target.alias, engine)
        return engine

    def release(self, target: ModelTarget) -> None:
        self.pool.release(target.base)

    @contextlib.asynccontextmanager
    async def leased(self, target: ModelTarget) -> AsyncIterator[ServingEngine]:
        engine = await self.lease(target)
        try:
            yield engine
        finally:
            self.release(target)

    def _release_if_acquired(self, target: ModelTarget, task: asyncio.Future[ServingEngine]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.release(target)

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
