"""Threads in tests whose failures reach the test: an assert in a helper thread must fail the test.

An exception in a plain ``threading.Thread`` only prints a warning (pytest's
``PytestUnhandledThreadExceptionWarning``, which tests/conftest.py turns into an error as a
safety net); these helpers hand it to the test thread instead, where it fails the test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

JOIN_S = 60.0


class CheckedThread(threading.Thread):
    """A thread whose exception (a failed assert included) ``join`` raises in the joining thread."""

    def __init__(self, target: Callable[..., Any], *args: Any, name: str | None = None) -> None:
        super().__init__(target=target, args=args, name=name, daemon=True)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            super().run()
        except BaseException as error:
            self.error = error

    def join(self, timeout: float | None = JOIN_S) -> None:
        """Wait for the thread; raise its exception, or AssertionError if it is still running."""
        super().join(timeout)
        if self.is_alive():
            raise AssertionError(f"thread {self.name} still running after {timeout} s")
        if self.error is not None:
            raise self.error


def run_threads(*threads: CheckedThread) -> None:
    """Start every thread, join them all, then raise the first failure (in start order)."""
    for thread in threads:
        thread.start()
    failures: list[BaseException] = []
    for thread in threads:
        try:
            thread.join()
        except BaseException as error:
            failures.append(error)
    if failures:
        raise failures[0]


class Failures:
    """Collects exceptions of calls that run on threads the test does not join itself (worker
    pools, callbacks); ``raise_first`` re-raises the first in the test thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.errors: list[BaseException] = []

    def guard(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` wrapped so that its exception is recorded here (and still raised)."""

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return call(*args, **kwargs)
            except BaseException as error:
                with self._lock:
                    self.errors.append(error)
                raise

        return guarded

    def raise_first(self) -> None:
        with self._lock:
            if self.errors:
                raise self.errors[0]
