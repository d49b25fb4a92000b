"""Give memory freed by a stopped engine back to the operating system.

glibc keeps freed heap memory in its arenas (one per thread that allocated), so an engine
built on one thread and freed leaves its weights' pages resident, and the next engine,
built on another thread, adds its own: resident memory grows by the model's size at every
restart. ``malloc_trim`` returns the free pages of every arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import sys

log = logging.getLogger(__name__)


def return_freed_memory() -> bool:
    """Collect garbage and trim glibc's arenas; False where the C library has no ``malloc_trim``."""
    gc.collect()
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # musl and other C libraries without it
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True
