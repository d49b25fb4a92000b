"""Files of the adapter library: private to the user, copied only from regular files.

Library folders are 0700 and library files 0600, set explicitly (the umask is not
trusted). A file copied in must be a regular file itself: a symbolic link (wherever it
points), a named pipe, a device or a socket is refused (``refusal``), and the source is
opened as every file an adapter brings is (``adapter_files``), so a link swapped in
meanwhile is not followed, a pipe never blocks the open, and no more than its cap is copied.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from multilora_studio.adapters.adapter_files import AdapterError, open_adapter_file, too_large
from multilora_studio.adapters.file_kinds import not_regular

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
CHUNK_BYTES = 1 << 20


def refusal(path: Path) -> str | None:
    """Why ``path`` may not be copied into the library (it is not a regular file), or None."""
    mode = path.lstat().st_mode
    kind = not_regular(mode)
    if kind is None:
        return None
    if stat.S_ISLNK(mode):
        kind += f" (to {os.readlink(path)})"
    return f"{path} is {kind}; the library copies only regular files inside the adapter folder"


def make_private_dir(path: Path) -> None:
    """Create ``path`` (its parent must exist) as a 0700 folder, or tighten it if it exists."""
    try:
        path.mkdir(mode=PRIVATE_DIR)
    except FileExistsError:
        if not path.is_dir() or path.is_symlink():
            raise
    tighten(path)


def tighten(path: Path) -> bool:
    """Make ``path`` 0700 (a folder) or 0600 (a file) if it is not; links are left alone.

    Returns whether it was not private before (a missing path or a link: False). A read-only
    file system or a file of another user is left as it is.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    wanted = PRIVATE_DIR if stat.S_ISDIR(mode) else PRIVATE_FILE
    if stat.S_ISLNK(mode) or stat.S_IMODE(mode) == wanted:
        return False
    try:
        os.chmod(path, wanted)
    except OSError as error:
        if error.errno not in (errno.EROFS, errno.EPERM, errno.EACCES):
            raise
    return True


def tighten_tree(folder: Path) -> None:
    """``tighten`` ``folder``, and what is under it where a folder was not private (links are
    not followed). Nobody else can reach into a private folder, so its contents are left as
    they are: opening a library of thousands of adapters does not visit each of their files.
    """
    if not tighten(folder):
        return
    with os.scandir(folder) as entries:
        children = [Path(entry.path) for entry in entries]
    for child in children:
        if child.is_dir() and not child.is_symlink():
            tighten_tree(child)
        else:
            tighten(child)


def create_private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (then tighten it)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE))
    tighten(path)


def copy_regular_file(source: Path, target: Path, max_bytes: int) -> None:
    """Copy ``source``, opened as every file an adapter brings is (``adapter_files``: a regular
    file of at most ``max_bytes``, no link followed), to the new private file ``target`` and
    flush it to disk.

    AdapterError if ``source`` may not be read so, or grows past ``max_bytes`` while it is
    copied; OSError if ``target`` cannot be written (full disk, read-only file system).
    """
    reading = open_adapter_file(source, max_bytes)
    try:
        writing = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
        try:
            os.fchmod(writing, PRIVATE_FILE)
            copied = 0
            while chunk := _read(reading, source):
                copied += len(chunk)
                if copied > max_bytes:
                    raise too_large(source, max_bytes)
                _write_all(writing, chunk)
            os.fsync(writing)
        finally:
            os.close(writing)
    finally:
        os.close(reading)


def write_private_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically, as a 0600 file."""
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.unlink(missing_ok=True)
    handle = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
    try:
        os.fchmod(handle, PRIVATE_FILE)
        _write_all(handle, text.encode())
    finally:
        os.close(handle)
    os.replace(staging, path)


def _read(handle: int, source: Path) -> bytes:
    try:
        return os.read(handle, CHUNK_BYTES)
    except OSError as error:
        raise AdapterError(f"cannot read {source}: {error.strerror}") from None


def _write_all(handle: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(handle, view) :]
