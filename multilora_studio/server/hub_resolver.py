"""Hub adapters on demand: a request for ``org/name[@rev]`` that nothing serves pulls it first.

The pull is the library's own (``adapters.pull``: validated against the served base,
pinned to its commit, registered in the library), run on a worker thread so neither
the event loop nor the engine's thread waits on the network. Concurrent requests for
the same repository and revision share one pull; a failed pull is forgotten, so a
later request tries again. The Hub endpoint is ``HF_ENDPOINT``, as for ``pull``.
"""

from __future__ import annotations

import asyncio
import logging

from multilora_studio.adapters.adapter_config import AdapterError
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.hub import HubError, HubNotFoundError, HubUnreachableError, parse_repo_ref
from multilora_studio.adapters.pull import pull
from multilora_studio.adapters.registry import Registry
from multilora_studio.deploy import BasePool, BaseUnavailable
from multilora_studio.server.errors import ApiError

log = logging.getLogger(__name__)


class HubResolver:
    """Pull, register and serve Hub adapters named by a request's ``model``; one pull per repo@rev."""

    def __init__(self, pool: BasePool, registry: Registry, wait_s: float) -> None:
        """Adapters pulled are served on the pool's first base."""
        if wait_s <= 0:
            raise ValueError(f"the Hub pull wait must be > 0 seconds, got {wait_s!r}")
        self.pool = pool
        self.registry = registry
        self.wait_s = wait_s
        self.pulls_started = 0
        self._pulls: dict[tuple[str, str | None], asyncio.Task[str]] = {}

    async def resolve(self, model: str) -> str:
        """The served adapter name for ``model`` once pulled; ApiError naming ``model`` otherwise."""
        try:
            key = parse_repo_ref(model)
        except HubError:
            raise ApiError(404, f"The model `{model}` does not exist.", "model_not_found", "model") from None
        if "/" not in key[0]:
            raise ApiError(404, f"The model `{model}` does not exist.", "model_not_found", "model")
        task = self._pulls.get(key)
        if task is None:
            self.pulls_started += 1
            task = asyncio.ensure_future(asyncio.to_thread(self._pull, model))
            self._pulls[key] = task
            task.add_done_callback(lambda done: self._forget(key, done))
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.wait_s)
        except TimeoutError:
            raise ApiError(
                504,
                f"The model `{model}` is still being pulled from the Hub after {self.wait_s:g} s; "
                "retry later.",
                "model_pull_timeout",
                "model",
            ) from None

    def _forget(self, key: tuple[str, str | None], task: asyncio.Task[str]) -> None:
        """A finished pull is not shared any more: a success is served, a failure may be retried."""
        self._pulls.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved even when every waiter timed out

    def _pull(self, model: str) -> str:
        """On a worker thread: pull ``model`` into the library and serve it on the first base."""
        try:
            with self.pool.lease(self.pool.primary) as engine:
                result = pull(
                    model,
                    self.registry,
                    lambda: BaseModelRef.of_engine(engine),
                    name=model,
                    max_rank=engine.config.max_lora_rank,
                    adapter_only=True,
                )
                assert result.adapter is not None  # adapter_only
                record = self.registry.load_into(engine, result.adapter.name, preload=False)
        except BaseUnavailable as error:
            raise ApiError(503, str(error), "model_unavailable", "model") from None
        except HubNotFoundError as error:
            raise ApiError(
                404, f"The model `{model}` does not exist: {error}", "model_not_found", "model"
            ) from None
        except HubUnreachableError as error:
            raise ApiError(
                502, f"The model `{model}` could not be pulled: {error}", "hub_unreachable", "model"
            ) from None
        except (HubError, AdapterError, ValueError) as error:
            raise ApiError(
                400,
                f"The model `{model}` cannot be served from the Hub: {error}",
                "invalid_hub_adapter",
                "model",
            ) from None
        log.info("pulled %s from the Hub and serving it as %s", model, record.name)
        return record.name
