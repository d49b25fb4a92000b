"""Counts Triton JIT compiles in this process, and the seconds they took.

A kernel variant compiles the first time a launch needs it (a new tile configuration,
a new integer specialisation); on the engine's worker thread that stalls every running
request for the compile's duration. The engine warms the variants its steps select at
start-up and reports compiles since then, so a stall has a name.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileCount:
    compiles: int
    seconds: float


class _CompileWatch:
    """Process-wide compile counter fed by Triton's hooks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: dict[int, float] = {}  # thread id -> when its current compile started
        self.count = 0
        self.seconds = 0.0
        self.installed = False

    def before(self) -> None:
        self.started[threading.get_ident()] = time.perf_counter()

    def after(self, what: str) -> None:
        start = self.started.pop(threading.get_ident(), None)
        took = time.perf_counter() - start if start is not None else 0.0
        with self.lock:
            self.count += 1
            self.seconds += took
        log.info("compiled Triton kernel %s in %.2f s", what, took)


_WATCH = _CompileWatch()


def install() -> bool:
    """Hook Triton's compile callbacks once (chaining hooks already set); False without Triton."""
    if _WATCH.installed:
        return True
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    previous_cache, previous_post = runtime.jit_cache_hook, runtime.jit_post_compile_hook

    def cache_hook(**kwargs: Any) -> bool:  # called only when a variant is not compiled yet
        _WATCH.before()
        return bool(previous_cache(**kwargs)) if previous_cache else False

    def post_hook(**kwargs: Any) -> None:
        _WATCH.after(str(kwargs.get("repr", "?")))
        if previous_post:
            previous_post(**kwargs)

    runtime.jit_cache_hook = cache_hook
    runtime.jit_post_compile_hook = post_hook
    _WATCH.installed = True
    return True


def compile_count() -> CompileCount:
    """Compiles seen since :func:`install`, and their seconds (cache loads included)."""
    with _WATCH.lock:
        return CompileCount(_WATCH.count, _WATCH.seconds)
