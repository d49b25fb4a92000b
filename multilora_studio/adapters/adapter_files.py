"""Reading the files an adapter folder brings: never through a symbolic link, never a pipe, a
device or a folder, never more than a size cap.

Each file is opened ``O_NOFOLLOW | O_NONBLOCK`` and judged on the open descriptor (``fstat``),
so a link swapped in after a check is never read, and a pipe never blocks the open. The one
link followed is the Hugging Face cache's own: in a snapshot (``.../snapshots/<revision>/``)
each file is a link to ``../../blobs/<hash>``. Such a link is followed only when it points
exactly there, and the blob is opened the same way through its folder, itself opened without
following a link.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from multilora_studio.adapters.file_kinds import not_regular
from multilora_studio.invalid_setting import InvalidSetting

# (Windows has O_BINARY and none of the three before it: there the open follows links)
READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
CHUNK_BYTES = 1 << 20
OPEN_FILE_FOLDERS = ("/proc/self/fd", "/dev/fd")  # a path per open descriptor (Linux, macOS)


class AdapterError(ValueError):
    """An adapter that cannot be used, with the reason."""

    def naming(self, path: str, name: str) -> AdapterError:
        """The same refusal with ``path`` written as ``name`` (the user's folder for a copy's)."""
        return AdapterError(str(self).replace(path, name))


class AdapterOverLimit(InvalidSetting, AdapterError):
    """An adapter a setting refuses: its rank above ``max_lora_rank``."""

    def naming(self, path: str, name: str) -> AdapterOverLimit:
        details = {key: str(value).replace(path, name) for key, value in self.details.items()}
        return AdapterOverLimit(self.template, self.values, details)


def size_words(size: int) -> str:
    """``size`` bytes in words: "1 MiB", "8 GiB", "1.5 KiB", "12 bytes"."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.3g} {unit}"
    return f"{size} bytes"


def too_large(path: Path, max_bytes: int) -> AdapterError:
    return AdapterError(f"{path} is larger than {size_words(max_bytes)}")


def open_adapter_file(path: Path, max_bytes: int) -> int:
    """A read-only descriptor of ``path``, a regular file of at most ``max_bytes`` reached
    without a link (module docstring); AdapterError naming what it is otherwise."""
    try:
        handle = os.open(path, READ_FLAGS)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.EMLINK):  # EMLINK: the BSDs' word for a link
            raise AdapterError(f"cannot read {path}: {error.strerror}") from None
        handle = _open_cache_blob(path)
    try:
        info = os.fstat(handle)
        kind = not_regular(info.st_mode)
        if kind is not None:
            raise AdapterError(f"{path} is {kind}, not a regular file")
        if info.st_size > max_bytes:
            raise too_large(path, max_bytes)
    except BaseException:
        os.close(handle)
        raise
    return handle


def read_adapter_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, opened as ``open_adapter_file`` opens it; AdapterError if it grows
    past ``max_bytes`` while it is read."""
    handle = open_adapter_file(path, max_bytes)
    try:
        return read_capped(handle, path, max_bytes)
    finally:
        os.close(handle)


def read_capped(handle: int, path: Path, max_bytes: int) -> bytes:
    """All of the open ``handle`` (``path``'s), or AdapterError past ``max_bytes``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = os.read(handle, min(CHUNK_BYTES, max_bytes + 1 - size))
        except OSError as error:
            raise AdapterError(f"cannot read {path}: {error.strerror}") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise too_large(path, max_bytes)


@contextmanager
def opened_adapter_file(path: Path, max_bytes: int) -> Iterator[Path]:
    """``path`` opened as ``open_adapter_file`` opens it, held open: yields a path naming the
    open file itself (``/proc/self/fd/N``), for readers that take a path (safetensors), so a
    link swapped in meanwhile is never read; ``path`` where the system has no such paths. An
    AdapterError raised inside names ``path``."""
    handle = open_adapter_file(path, max_bytes)
    folder = next((Path(f) for f in OPEN_FILE_FOLDERS if os.path.isdir(f)), None)
    held = path if folder is None else folder / str(handle)
    try:
        yield held
    except AdapterError as error:  # name the file, not the descriptor's path
        raise error.naming(str(held), str(path)) from None
    finally:
        os.close(handle)


def _open_cache_blob(path: Path) -> int:
    """The blob a Hugging Face cache snapshot's ``path`` links to; AdapterError for any other link."""
    target = os.readlink(path)
    snapshot = path.parent
    blobs = Path(os.path.normpath(snapshot.parent.parent / "blobs"))
    pointed = Path(os.path.normpath(os.path.join(snapshot, target)))
    if snapshot.parent.name != "snapshots" or pointed.parent != blobs:
        raise AdapterError(
            f"{path} is a symbolic link (to {target}); an adapter's files must be regular files in "
            "its folder (a Hugging Face cache snapshot's links to its blobs excepted)"
        )
    try:
        folder = os.open(blobs, READ_FLAGS | os.O_DIRECTORY)
        try:
            return os.open(pointed.name, READ_FLAGS, dir_fd=folder)
        finally:
            os.close(folder)
    except OSError as error:
        raise AdapterError(f"cannot read {path} (a link to {pointed}): {error.strerror}") from None
