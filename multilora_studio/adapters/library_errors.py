"""The adapter library's errors, and the one line a full or read-only disk becomes."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
# SQLite result codes (sqlite3.h; Python's sqlite3 has them, its type stubs do not)
SQLITE_PERM, SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN = 3, 8, 10, 13, 14
SQLITE_IOERR_SHMSIZE = SQLITE_IOERR | (19 << 8)  # the -shm file could not grow: a full disk under WAL
SQLITE_CAUSES = {  # extended codes first, then primary ones
    SQLITE_IOERR_SHMSIZE: "no space left on device",
    SQLITE_FULL: "no space left on device",
    SQLITE_READONLY: "the database is read-only",
    SQLITE_CANTOPEN: "the database cannot be opened",
    SQLITE_PERM: "permission denied",
    SQLITE_IOERR: "disk I/O error",
}


class LibraryError(ValueError):
    """A library operation that cannot be done, with the reason."""


class NameTaken(LibraryError):
    """A name the library refuses for an adapter (not a valid name, or taken): ``reason`` says why,
    the message asks for another name."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}; choose another name")
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return type(self), (self.reason,)


class StorageError(LibraryError):
    """The library's disk refused a write or a read: full, read-only or not ours."""

    def __init__(self, message: str, cause: str = "") -> None:
        super().__init__(message)
        self.cause = cause or message


def storage_error(error: OSError | sqlite3.Error, action: str) -> StorageError:
    """``<cause> while <action>; nothing was changed`` as a StorageError (``action`` names the place)."""
    cause = cause_of(error)
    return StorageError(f"{cause} while {action}; nothing was changed", cause)


def cause_of(error: OSError | sqlite3.Error) -> str:
    """The words for what went wrong."""
    if isinstance(error, OSError):
        return CAUSES.get(error.errno or 0, (error.strerror or str(error)).lower())
    code = getattr(error, "sqlite_errorcode", 0)
    for known in (code, code & 0xFF):
        if known in SQLITE_CAUSES:
            return SQLITE_CAUSES[known]
    return str(error)


def unwritable(folder: Path) -> OSError | None:
    """Why the existing ``folder`` cannot be written (read-only file system, permissions), or None."""
    if not folder.is_dir() or os.access(folder, os.W_OK):
        return None
    read_only = hasattr(os, "statvfs") and bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    code = errno.EROFS if read_only else errno.EACCES
    return OSError(code, os.strerror(code), str(folder))
