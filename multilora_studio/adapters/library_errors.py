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
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
SQLITE_CAUSES = {  # primary result codes (sqlite3 names them since Python 3.11)
    sqlite3.SQLITE_FULL: (errno.ENOSPC, "no space left on device"),
    sqlite3.SQLITE_READONLY: (errno.EROFS, "the database is read-only"),
    sqlite3.SQLITE_CANTOPEN: (errno.EACCES, "the database cannot be opened"),
    sqlite3.SQLITE_PERM: (errno.EACCES, "permission denied"),
    sqlite3.SQLITE_IOERR: (errno.EIO, "disk I/O error"),
}

SQLITE_EXTENDED_CAUSES = {  # the -shm file could not grow: what a full disk gives a WAL database
    sqlite3.SQLITE_IOERR_SHMSIZE: (errno.ENOSPC, "no space left on device"),
}


class LibraryError(ValueError):
    """A library operation that cannot be done, with the reason."""


class StorageError(LibraryError):
    """The library's disk refused a write or a read: full, read-only or not ours."""

    def __init__(self, message: str, code: int | None, cause: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.cause = cause or message

    @property
    def read_only(self) -> bool:
        """The disk or folder cannot be written (as opposed to full or failing)."""
        return self.code in READ_ONLY


def storage_error(error: OSError | sqlite3.Error, action: str) -> StorageError:
    """``<cause> while <action>; nothing was changed`` as a StorageError (``action`` names the place)."""
    code, cause = cause_of(error)
    return StorageError(f"{cause} while {action}; nothing was changed", code, cause)


def cause_of(error: OSError | sqlite3.Error) -> tuple[int | None, str]:
    """The errno-like code and the words for what went wrong."""
    if isinstance(error, OSError):
        return error.errno, CAUSES.get(error.errno or 0, (error.strerror or str(error)).lower())
    code = getattr(error, "sqlite_errorcode", 0)
    if code in SQLITE_EXTENDED_CAUSES:
        return SQLITE_EXTENDED_CAUSES[code]
    primary = code & 0xFF
    if primary in SQLITE_CAUSES:
        return SQLITE_CAUSES[primary]
    return None, str(error)


def unwritable(folder: Path) -> OSError | None:
    """Why the existing ``folder`` cannot be written (read-only file system, permissions), or None."""
    if not folder.is_dir() or os.access(folder, os.W_OK):
        return None
    read_only = hasattr(os, "statvfs") and bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    code = errno.EROFS if read_only else errno.EACCES
    return OSError(code, os.strerror(code), str(folder))
