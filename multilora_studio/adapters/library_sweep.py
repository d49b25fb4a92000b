"""Finishing what a crashed library write (kill -9, power loss) left behind.

Every write that creates, moves or deletes the library's files (an import, a removal, an
archive, a restore) holds a shared lock on the library's ``library.lock`` from its first file
to its last (``writing``). Opening the library takes that lock exclusively without waiting
(``sweep``), and only when it gets it, so while no write is under way in any process, does it
touch anything: then a staging entry, a folder or an archive that no row names, and the
folder of an archived adapter, are a crash's leftovers and are deleted, and a folder moved
aside (trash) whose row still wants it is put back. While another process writes, nothing is
swept; the next open does it. The locks are ``flock`` locks: the kernel drops them when a
process dies. Without ``fcntl`` (Windows) nothing is swept.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.private_files import PRIVATE_FILE

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

LOCK_FILE = "library.lock"  # next to the database
STAGING_PREFIX = ".tmp-"  # + a fresh token: a write's files before they move into place
TRASH_PREFIX = ".trash-"  # + the adapter's folder name, "." and a fresh token: a folder moved aside


@dataclass(frozen=True)
class NamedByRows:
    """What the rows name: the adapters whose folder must exist (all but the archived ones)
    and the archives' file names."""

    live: frozenset[str]
    archives: frozenset[str]


def trash_name(folder: Path, token: str) -> Path:
    """Where a write moves ``folder`` aside (its own fresh ``token``), next to it."""
    return folder.with_name(f"{TRASH_PREFIX}{folder.name}.{token}")


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


def sweep(adapters_dir: Path, archives_dir: Path, lock: Path, named: Callable[[], NamedByRows]) -> None:
    """Delete leftovers of crashed writes and put back interrupted moves, when no write is
    under way (module docstring)."""
    handle = _open_lock(lock)
    try:
        if fcntl is None or not _try_exclusive(handle):
            return
        rows = named()
        _sweep_folders(adapters_dir, rows)
        if archives_dir.is_dir():
            _sweep_archives(archives_dir, rows)
    finally:
        os.close(handle)


def _sweep_folders(adapters_dir: Path, rows: NamedByRows) -> None:
    with os.scandir(adapters_dir) as entries:  # names first: a Path per folder is slow in thousands
        unknown = sorted(entry.name for entry in entries if entry.name not in rows.live)
    for name in unknown:
        entry = adapters_dir / name
        if entry.is_symlink() or not entry.is_dir():
            continue
        owner = name.removeprefix(TRASH_PREFIX).partition(".")[0]
        if name.startswith(TRASH_PREFIX) and owner in rows.live and not (adapters_dir / owner).exists():
            log.info("restoring %s: the write that moved it aside did not commit", adapters_dir / owner)
            os.replace(entry, adapters_dir / owner)
            continue
        log.info("removing leftover %s", entry)
        shutil.rmtree(entry, ignore_errors=True)


def _sweep_archives(archives_dir: Path, rows: NamedByRows) -> None:
    with os.scandir(archives_dir) as entries:
        leftovers = sorted(entry.name for entry in entries if entry.name not in rows.archives)
    for name in leftovers:
        entry = archives_dir / name
        if entry.is_file() and not entry.is_symlink():
            log.info("removing leftover %s", entry)
            entry.unlink(missing_ok=True)


def _open_lock(lock: Path) -> int:
    return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)


def _try_exclusive(handle: int) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
