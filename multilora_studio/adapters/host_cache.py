"""Host-RAM tier of adapters: an LRU of validated adapters, filled by a background loader.

A miss never blocks the caller: ``lookup`` queues a load on a loader thread and
``on_ready`` is called when it is done (or failed), so the engine keeps stepping. A
load that ``put`` or ``discard`` overtook while it ran is dropped when it finishes.

A failed load is remembered (requests for the adapter fail with its error, without reading
the disk again) only while the adapter's files are unchanged and for ``FAILED_LOAD_TTL_S``:
the next lookup after a repair, or after that time, loads it again, once for every request
that waits.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from multilora_studio.adapters.load_latency import TierCounters
from multilora_studio.adapters.short_lived_workers import ShortLivedWorkers


class Cacheable(Protocol):
    """What the tier keeps: anything with a name and a size (validated or packed adapters)."""

    name: str

    @property
    def nbytes(self) -> int: ...


AdapterT = TypeVar("AdapterT", bound=Cacheable)
FAILED_LOAD_TTL_S = 10.0  # a failure whose files did not change is retried after this long

Fingerprint = tuple[tuple[str, int, int, int], ...] | None


def files_fingerprint(folder: Path) -> Fingerprint:
    """(name, size, mtime, inode) of the folder's files: changes whenever a file is written or
    replaced; None when the folder cannot be read."""
    try:
        entries = sorted(folder.iterdir())
        return tuple((e.name, (st := e.stat()).st_size, st.st_mtime_ns, st.st_ino) for e in entries)
    except OSError:
        return None


@dataclass(frozen=True)
class _Failure:
    error: Exception
    path: Path
    fingerprint: Fingerprint
    at: float  # time.monotonic()

    def stale(self) -> bool:
        """Whether a new load could succeed: the files changed or the failure is old."""
        if time.monotonic() - self.at >= FAILED_LOAD_TTL_S:
            return True
        return files_fingerprint(self.path) != self.fingerprint


class HostAdapterCache(Generic[AdapterT]):
    """At most ``capacity`` adapters in host memory, least recently used evicted first.

    Up to ``load_workers`` loads run at once, on threads that end when none is queued.
    """

    def __init__(
        self,
        capacity: int,
        loader: Callable[[str, Path], AdapterT],
        on_ready: Callable[[], None],
        load_workers: int = 1,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"the host adapter cache needs a capacity >= 1, got {capacity}")
        self.capacity = capacity
        self._loader = loader
        self._on_ready = on_ready
        self._entries: OrderedDict[str, AdapterT] = OrderedDict()
        self._bytes = 0  # of the entries
        self._pending: dict[str, object] = {}  # name -> ticket of its load in flight
        self._errors: dict[str, _Failure] = {}
        self._fresh: set[str] = set()  # loaded after a miss and not looked up since
        self._new_failures: list[str] = []  # loads that failed since the last take_failures()
        self._lock = threading.Lock()
        self._workers = ShortLivedWorkers(load_workers, "adapter-loader")
        self.counters = TierCounters()

    def get(self, name: str) -> AdapterT | None:
        with self._lock:
            adapter = self._entries.get(name)
            if adapter is not None:
                self._entries.move_to_end(name)
            return adapter

    def holds(self, name: str) -> bool:
        """Whether ``name`` is resident (no hit counted, LRU order unchanged)."""
        with self._lock:
            return name in self._entries

    def loading(self, name: str) -> bool:
        """Whether a load of ``name`` is in flight."""
        with self._lock:
            return name in self._pending

    def eviction_candidate(self) -> str | None:
        """The adapter a new load would evict once the loads in flight have finished (each of
        those evicts the least recently used in turn), None while there is room. It may be an
        adapter still loading: with more loads in flight than the tier has room for, a new one
        would push out what an earlier load brought in."""
        with self._lock:
            taken = len(self._entries) + len(self._pending) - self.capacity  # evictions already due
            if taken < 0:
                return None
            after_loads = [*self._entries, *self._pending]  # least recently used first, loads last
            return after_loads[taken]  # taken < len(after_loads): the capacity is at least 1

    @property
    def loads_in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    @property
    def nbytes(self) -> int:
        """Bytes of the adapters held now."""
        with self._lock:
            return self._bytes

    def names(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def error_of(self, name: str) -> Exception | None:
        """Why the last load of ``name`` failed, while that still holds (see the module docstring)."""
        with self._lock:
            failure = self._errors.get(name)
        if failure is None:
            return None
        if failure.stale():
            with self._lock:
                if self._errors.get(name) is failure:
                    del self._errors[name]
            return None
        return failure.error

    def take_failures(self) -> list[str]:
        """The adapters whose load failed since the last call (each failure reported once)."""
        with self._lock:
            failed, self._new_failures = self._new_failures, []
        return failed

    def put(self, adapter: AdapterT) -> None:
        with self._lock:
            self._insert(adapter)

    def _insert(self, adapter: AdapterT) -> None:
        self._pending.pop(adapter.name, None)  # a load still in flight would be older than this
        self._drop(adapter.name)
        self._entries[adapter.name] = adapter
        self._bytes += adapter.nbytes
        self._errors.pop(adapter.name, None)
        while len(self._entries) > self.capacity:
            self._drop(next(iter(self._entries)))

    def _drop(self, name: str) -> None:
        dropped = self._entries.pop(name, None)
        if dropped is not None:
            self._bytes -= dropped.nbytes

    def lookup(self, name: str, path: Path) -> AdapterT | None:
        """The adapter if resident (a hit); otherwise start loading it (a miss) and return None."""
        with self._lock:
            adapter = self._entries.get(name)
            if adapter is not None:
                self._entries.move_to_end(name)
                if name in self._fresh:
                    self._fresh.discard(name)  # the end of the miss that loaded it, not a hit
                else:
                    self.counters.hits += 1
                return adapter
            if name in self._pending:
                return None
            failure = self._errors.get(name)
        if failure is not None and not failure.stale():
            return None
        with self._lock:
            if name in self._entries or name in self._pending or self._errors.get(name) is not failure:
                return None  # another thread got here first: its load serves this lookup too
            self._errors.pop(name, None)
            self.counters.misses += 1
            ticket = self._pending[name] = object()
            self._workers.submit(self._load, name, path, ticket)
            return None

    def _load(self, name: str, path: Path, ticket: object) -> None:
        start = time.perf_counter()
        fingerprint = files_fingerprint(path)  # before reading: a repair during the load counts
        try:
            adapter = self._loader(name, path)
        except Exception as error:  # reported to the requests that wait for it
            with self._lock:
                if self._pending.get(name) is ticket:
                    self._errors[name] = _Failure(error, path, fingerprint, time.monotonic())
                    del self._pending[name]
                    self._new_failures.append(name)
        else:
            with self._lock:
                if self._pending.get(name) is ticket:
                    self._insert(adapter)
                    self._fresh.add(name)
                    self.counters.bytes_loaded += adapter.nbytes
                    self.counters.record(name, time.perf_counter() - start)
        self._on_ready()

    def discard(self, name: str) -> None:
        with self._lock:
            self._fresh.discard(name)
            self._drop(name)
            self._errors.pop(name, None)
            self._pending.pop(name, None)

    def close(self) -> None:
        self._workers.shutdown()
