"""Hub adapters on demand: an admin's request for ``org/name[@rev]`` that nothing serves pulls it first.

The pull is the library's own (``adapters.pull``: validated against the served base,
pinned to its commit, registered in the library). Pulls are bounded: at most
``at_once`` run together, each on a thread of the resolver's own (never the event loop's
shared pool, which every request's tokenizing uses), at most ``limit`` adapters in all
while the server runs, and at most ``max_bytes`` of files each, checked against the sizes
the Hub gives before anything is downloaded. Concurrent requests for the same repository
and revision share one pull; a failed pull is forgotten, so a later request tries again.
Stopping the server cancels pulls in flight. The Hub endpoint is ``HF_ENDPOINT``, as for
``pull``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from multilora_studio.adapters.adapter_config import AdapterError
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.hub import (
    HubError,
    HubNotFoundError,
    HubUnreachableError,
    PullCancelled,
    PullTooLarge,
    parse_repo_ref,
)
from multilora_studio.adapters.pull import pull
from multilora_studio.adapters.registry import Registry
from multilora_studio.deploy import BasePool, BaseUnavailable
from multilora_studio.server.errors import ApiError

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5  # when every pull slot is taken


class HubResolver:
    """Pull, register and serve Hub adapters named by a request's ``model``; one pull per repo@rev."""

    def __init__(
        self, pool: BasePool, registry: Registry, wait_s: float, at_once: int, limit: int, max_bytes: int
    ) -> None:
        """Adapters pulled are served on the pool's first base."""
        if wait_s <= 0:
            raise ValueError(f"the Hub pull wait must be > 0 seconds, got {wait_s!r}")
        self.pool = pool
        self.registry = registry
        self.wait_s = wait_s
        self.at_once = at_once
        self.limit = limit
        self.max_bytes = max_bytes
        self.pulls_started = 0
        self.pulled = 0  # pulls that succeeded
        self._pulls: dict[tuple[str, str | None], asyncio.Future[str]] = {}
        self._workers: ThreadPoolExecutor | None = None
        self._cancel = threading.Event()  # set by close(): the pulls in flight stop

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
            self._check_room(model)
            self.pulls_started += 1
            if self._workers is None:
                self._workers = ThreadPoolExecutor(self.at_once, thread_name_prefix="hub-pull")
            loop = asyncio.get_running_loop()
            task = loop.run_in_executor(self._workers, self._pull, model, self._cancel)
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

    def _check_room(self, model: str) -> None:
        """429 while ``at_once`` pulls run; 403 once ``limit`` adapters are pulled (or being pulled)."""
        if len(self._pulls) >= self.at_once:
            raise ApiError(
                429,
                f"The model `{model}` cannot be pulled now: {len(self._pulls)} Hub pulls are running "
                f"(at most {self.at_once} at once); retry later.",
                "hub_pulls_busy",
                "model",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        if self.pulled + len(self._pulls) >= self.limit:
            raise ApiError(
                403,
                f"The model `{model}` cannot be pulled: this server has pulled its limit of {self.limit} "
                "adapters from the Hub (--hub-pull-limit); add more with `multilora-studio pull`.",
                "hub_pull_limit",
                "model",
            )

    def _forget(self, key: tuple[str, str | None], task: asyncio.Future[str]) -> None:
        """A finished pull is not shared any more: a success is served, a failure may be retried."""
        self._pulls.pop(key, None)
        if not task.cancelled() and task.exception() is None:
            self.pulled += 1

    def close(self) -> None:
        """Cancel the pulls in flight (they stop at their next chunk) without waiting for them."""
        self._cancel.set()
        self._cancel = threading.Event()
        if self._workers is not None:
            self._workers.shutdown(wait=False, cancel_futures=True)
            self._workers = None

    def _pull(self, model: str, cancel: threading.Event) -> str:
        """On a pull thread: pull ``model`` into the library and serve it on the first base."""
        try:
            with self.pool.lease(self.pool.primary) as engine:
                result = pull(
                    model,
                    self.registry,
                    lambda: BaseModelRef.of_engine(engine),
                    name=model,
                    max_rank=engine.config.max_lora_rank,
                    cancel=cancel,
                    adapter_only=True,
                    max_bytes=self.max_bytes,
                )
                assert result.adapter is not None  # adapter_only
                record = self.registry.load_into(engine, result.adapter.name, preload=False)
        except BaseUnavailable as error:
            raise ApiError(503, str(error), "model_unavailable", "model") from None
        except PullCancelled:
            message = f"The pull of `{model}` stopped: the server is stopping."
            raise ApiError(503, message, "aborted", "model") from None
        except PullTooLarge as error:
            raise ApiError(
                413, f"The model `{model}` is too large to pull: {error}", "hub_pull_too_large", "model"
            ) from None
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
