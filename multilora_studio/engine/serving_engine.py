"""What serving needs of an engine, by role: one ``Engine``, a ``ReplicaSet`` of engines behind
one dispatcher, or a Ray deployment's ``RemoteEngine``; the server, the base pool and the window
talk to each through these.

Every engine serves requests (``RequestServing``, in ``request_methods``) and keeps a catalog of adapters
(``AdapterCatalog``); ``ServingEngine`` is the two together. Pinning adapters in GPU slots
(``AdapterPinning``), metrics snapshots (``MetricsSource``) and swapping the base out
(``ParkableEngine``) are roles an engine offers only where it has them: a consumer asks for
the role it needs (``isinstance``, or ``metrics_of`` / ``pinned_of``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from multilora_studio.engine.loop.request_methods import RequestServing
from multilora_studio.engine.outputs import EngineMetrics
from multilora_studio.engine.residency.adapter_catalog import AdapterInfo


class AdapterCatalog(ABC):
    """The adapters an engine serves: added, removed, listed, read into host RAM ahead."""

    @abstractmethod
    def add_adapter(self, name: str, path: str | Path, preload: bool = True) -> AdapterInfo:
        """Serve the PEFT folder at ``path`` as ``name`` (read into host RAM now with ``preload``)."""

    @abstractmethod
    def remove_adapter(self, name: str) -> None:
        """Stop serving ``name``."""

    @abstractmethod
    def prefetch_adapters(self, names: Sequence[str], timeout: float | None = None) -> dict[str, str | None]:
        """Read ``names`` into host RAM ahead of their requests: name -> error, or None when read."""

    @abstractmethod
    def list_adapters(self) -> list[AdapterInfo]:
        """Every adapter served, with where it lives now."""

    @abstractmethod
    def has_adapter(self, name: str) -> bool:
        """Whether ``name`` is served."""


class ServingEngine(RequestServing, AdapterCatalog):
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
