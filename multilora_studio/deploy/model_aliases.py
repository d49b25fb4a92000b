"""Other names of served adapters (the library's aliases) and, per alias, the adapters read into
host RAM when a request first uses it.

"First" is per engine: the first request for the alias since the engine of its base started
(an engine stopped and started again warms again; a parked one, which keeps its host tier, does
not). Bookkeeping only; ``BasePool`` resolves the names and runs the reads.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from multilora_studio.adapters.registry_schema import AdapterRecord


class ModelAliases:
    """alias -> adapter name, and alias -> its warm list (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._targets: dict[str, str] = {}
        self._warm: dict[str, tuple[str, ...]] = {}
        self._used_on: dict[str, weakref.ref[Any]] = {}  # alias -> the engine it was first used on

    def set(self, alias: str, adapter: str, warm: Sequence[str] = ()) -> None:
        """``alias`` names ``adapter``; ``warm``: the adapters to read on its first use."""
        with self._lock:
            self._targets[alias] = adapter
            self._warm[alias] = tuple(warm)

    def add_record(self, record: AdapterRecord) -> None:
        """Serve a library adapter's aliases as other names of it, each with its warm list."""
        lists = dict(record.alias_warm)
        for alias in record.aliases:
            self.set(alias, record.name, lists.get(alias, ()))

    def target(self, alias: str) -> str | None:
        """The adapter ``alias`` names (None: not an alias)."""
        return self._targets.get(alias)

    def warm_list(self, alias: str) -> tuple[str, ...]:
        return self._warm.get(alias, ())

    def first_use(self, alias: str, engine: Any) -> tuple[str, ...]:
        """``alias``'s warm list when this is its first use on ``engine`` (the engine of its
        base now), else ()."""
        with self._lock:
            used = self._used_on.get(alias)
            if used is not None and used() is engine:
                return ()
            self._used_on[alias] = weakref.ref(engine)
            return self._warm.get(alias, ())
