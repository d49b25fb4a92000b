"""What serving needs of an engine, by role: one ``Engine``, a ``ReplicaSet`` of engines behind
one dispatcher, or a Ray deployment's ``RemoteEngine``; the server, the base pool and the window
talk to each through these.

Every engine serves requests (``RequestServing``) and keeps a catalog of adapters
(``AdapterCatalog``); ``ServingEngine`` is the two together. Pinning adapters in GPU slots
(``AdapterPinning``), metrics snapshots (``MetricsSource``) and swapping the base out
(``ParkableEngine``) are roles an engine offers only where it has them: a consumer asks for
the role it needs (``isinstance``, or ``metrics_of`` / ``pinned_of``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from multilora_studio.engine.adapter_residency import AdapterInfo
from multilora_studio.engine.chat_tokens import Render
from multilora_studio.engine.config import EngineConfig, SamplingParams
from multilora_studio.engine.model_spec import ModelSpec
from multilora_studio.engine.outputs import EngineMetrics, RequestOutput, TokenDelta
from multilora_studio.engine.prompts import Prompt
from multilora_studio.engine.requests import RequestStream


class RequestServing(Protocol):
    """Requests in, tokens out, for the base and its adapters."""

    config: EngineConfig
    spec: ModelSpec
    tokenizer: Any
    model_name: str
    base_digest: str
    model_folder: Path | None  # the base's weights (None: random weights)
    device: torch.device  # a replica set's first replica's
    dtype: torch.dtype

    @property
    def running(self) -> bool: ...

    def encode(
        self, prompt: Any, special_tokens_in_content: bool = False, adapter: str | None = None
    ) -> list[int]: ...

    def tokenizer_for(self, adapter: str | None) -> Any: ...

    def renderer_for(self, adapter: str | None) -> Render: ...

    def vocab_size_of(self, adapter: str | None) -> int: ...

    def submit(
        self,
        prompt: Prompt,
        adapter: str | None = None,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> RequestStream: ...

    def submit_many(
        self, requests: Sequence[tuple[Prompt, str | None, SamplingParams | None]]
    ) -> list[RequestStream]: ...

    def abort(self, request_id: str) -> None: ...

    def generate(
        self,
        prompts: Sequence[Prompt],
        adapter_names: Sequence[str | None] | None = None,
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]: ...

    def score(
        self,
        prompts: Sequence[Prompt],
        adapter_names: Sequence[str | None] | None = None,
        top_k: int = 0,
        adapter_scales: Sequence[float] | None = None,
    ) -> list[RequestOutput]: ...

    def stream(
        self, prompt: Prompt, adapter: str | None = None, params: SamplingParams | None = None
    ) -> Iterator[TokenDelta]: ...

    def astream(
        self, prompt: Prompt, adapter: str | None = None, params: SamplingParams | None = None
    ) -> AsyncIterator[TokenDelta]: ...

    def shutdown(self) -> None: ...


class AdapterCatalog(Protocol):
    """The adapters an engine serves: added, removed, listed, read into host RAM ahead."""

    def add_adapter(self, name: str, path: str | Path, preload: bool = True) -> AdapterInfo: ...

    def remove_adapter(self, name: str) -> None: ...

    def prefetch_adapters(
        self, names: Sequence[str], timeout: float | None = None
    ) -> dict[str, str | None]: ...

    def list_adapters(self) -> list[AdapterInfo]: ...

    def has_adapter(self, name: str) -> bool: ...


class ServingEngine(RequestServing, AdapterCatalog, Protocol):
    """What every engine is: it serves requests and keeps its adapters."""


@runtime_checkable
class AdapterPinning(Protocol):
    """An engine that can hold adapters in GPU slots for good (a Ray deployment's replicas keep
    theirs by Ray's multiplexed LRU instead)."""

    def pin_adapter(self, name: str, pinned: bool = True) -> None: ...

    def pinned_adapters(self) -> list[str]: ...


@runtime_checkable
class MetricsSource(Protocol):
    """An engine that takes snapshots of its own state (slots, tiers, steps)."""

    def metrics(self, fresh: bool = False) -> EngineMetrics | None: ...


def metrics_of(engine: object, fresh: bool = False) -> EngineMetrics | None:
    """``engine``'s metrics snapshot; None when it takes none (or has none yet)."""
    return engine.metrics(fresh) if isinstance(engine, MetricsSource) else None


def pinned_of(engine: object) -> list[str]:
    """The adapters ``engine`` pins; none when it cannot pin."""
    return engine.pinned_adapters() if isinstance(engine, AdapterPinning) else []


@runtime_checkable
class ParkableEngine(Protocol):
    """A serving engine that can swap its base out and back in and stay itself (``Engine.park``):
    the base pool's fast time-share swap; other engines are stopped and started again."""

    def park_bytes(self) -> int: ...

    def park(self) -> None: ...

    def unpark(self) -> None: ...
