"""Where a workflow model keeps what it remembers between sessions: any store of values by key."""

from __future__ import annotations

from typing import Any, Protocol


class Store(Protocol):
    """Values by key (the window's ``Preferences``; a test's own dictionary-backed store)."""

    def get(self, key: str, default: Any) -> Any: ...

    def set(self, key: str, value: Any) -> None: ...
