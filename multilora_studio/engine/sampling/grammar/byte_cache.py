"""A least-recently-used map bounded by the bytes its entries weigh (not thread-safe)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class ByteBoundedCache(Generic[K, V]):
    """Entries with a weight in bytes; the least recently used leave once the weights pass
    ``max_bytes``. An entry heavier than ``max_bytes`` on its own is not kept."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V, nbytes: int) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old[1]
        if nbytes > self.max_bytes:
            return
        self._entries[key] = (value, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.nbytes -= dropped
