"""Finishing what a crashed library write (kill -9, power loss) left behind.

Every write that creates or moves an adapter folder holds a shared lock on the
library's ``library.lock`` while it runs (``writing``). Opening the library takes that
lock exclusively without waiting (``sweep``): when it gets it, no such write is under way
in any process, so every staging folder and every folder without a row is a crash's
leftover and is deleted, and a removal's trash whose row is still there (the crash came
before its commit) is put back. While another process writes, only leftovers older than
an hour are touched. The locks are ``flock`` locks: the kernel drops them when a process
dies. Without ``fcntl`` (Windows) leftovers are swept by age only.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from multilora_studio.adapters.private_files import PRIVATE_FILE

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

LOCK_FILE = "library.lock"  # next to the database
STAGING_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
STALE_AFTER_S = 3600.0


@contextmanager
def writing(lock: Path) -> Iterator[None]:
    """Hold the shared writers' ``lock`` for one write."""
    handle = _open_lock(lock)
    try:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_SH)
        yield
    finally:
        os.close(handle)


def sweep(adapters_dir: Path, lock: Path, known_ids: Callable[[], set[str]]) -> None:
    """Delete leftovers of crashed writes and restore interrupted removals (module docstring)."""
    handle = _open_lock(lock)
    try:
        alone = fcntl is not None and _try_exclusive(handle)
        known = known_ids()
        cutoff = time.time() - STALE_AFTER_S
        with os.scandir(adapters_dir) as entries:  # names first: a Path per folder is slow in thousands
            unknown = sorted(entry.name for entry in entries if entry.name not in known)
        for name in unknown:
            entry = adapters_dir / name
            if entry.is_symlink() or not entry.is_dir():
                continue
            if not alone and not _older_than(entry, cutoff):
                continue
            owner = entry.name.removeprefix(TRASH_PREFIX)
            if entry.name.startswith(TRASH_PREFIX) and owner in known and not (adapters_dir / owner).exists():
                log.info("restoring %s: its removal did not commit", adapters_dir / owner)
                os.replace(entry, adapters_dir / owner)
                continue
            log.info("removing leftover %s", entry)
            shutil.rmtree(entry, ignore_errors=True)
    finally:
        os.close(handle)


def _open_lock(lock: Path) -> int:
    return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)


def _try_exclusive(handle: int) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _older_than(entry: Path, cutoff: float) -> bool:
    try:
        return entry.stat().st_mtime < cutoff
    except FileNotFoundError:
        return False
