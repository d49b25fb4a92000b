"""Background calls on threads that exit as soon as there is nothing left to run.

A thread that calls into torch on the CPU keeps its own OpenMP worker pool for as long as
it lives, and once more pool threads exist than cores, libgomp stops spin-waiting in
every pool. A CPU engine whose adapter loader thread stayed alive after its first load
decoded about 20% slower from then on (SmolLM2-135M, 2 cores: 28 -> 22 tok/s). Threads
that end with their work take their pools with them.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class ShortLivedWorkers:
    """Runs submitted calls, at most ``max_workers`` at once, on threads that end when idle.

    Calls should handle their own errors; one that raises is logged and does not stop the others.
    """

    def __init__(self, max_workers: int, name: str) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self._name = name
        self._queue: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name} workers are shut down")
            self._queue.append((fn, args))
            if len(self._threads) < self.max_workers:
                name = f"{self._name}-{len(self._threads)}"
                thread = threading.Thread(target=self._drain, name=name, daemon=True)
                self._threads.add(thread)
                thread.start()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue or self._closed:
                    self._threads.discard(threading.current_thread())
                    return
                fn, args = self._queue.popleft()
            try:
                fn(*args)
            except Exception:  # the call's own business; keep draining
                log.exception("a %s call failed", self._name)

    def running(self) -> int:
        """Threads alive now (0 once everything submitted has finished)."""
        with self._lock:
            return len(self._threads)

    def shutdown(self) -> None:
        """Drop the calls not yet started and wait for the running ones."""
        with self._lock:
            self._closed = True
            self._queue.clear()
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()


def call_on_short_lived_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a thread of its own that ends with it (its exception re-raised here)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as error:  # handed to the caller
            outcome.append((False, error))

    thread = threading.Thread(target=run, name="short-lived-call", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
