"""Polling instead of fixed sleeps: wait for what a test needs, never for a guessed duration."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.005


def wait_until(condition: Callable[[], object], timeout: float = 10.0, what: str = "the condition") -> None:
    """Return as soon as ``condition()`` is true; AssertionError naming ``what`` after ``timeout`` s.

    The timeout only bounds a hang: it is no claim about how fast anything is.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_S)
