"""An adapter's files packed into one compressed tar archive with a manifest of their sizes and
SHA-256s, and unpacked again.

Packing reads each of the library's kept files (``kept_files``) as every adapter file is read
(``adapter_files``: no link but the Hugging Face cache's own, within its cap). Unpacking
trusts nothing in the archive: the manifest comes first and lists only kept files' bare names,
each within its cap; every other member must be one of them, once, a regular file of the size
listed, and is streamed to disk and hashed as it is read, so no member is ever held whole in
memory. No single read of the archive is larger than ``MAX_READ_BYTES`` (a crafted member
header that declares gigabytes is refused, not read).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from multilora_studio.adapters.adapter_config import CONFIG_FILE, WEIGHTS_FILE
from multilora_studio.adapters.adapter_files import AdapterError, open_adapter_file
from multilora_studio.adapters.kept_files import KEPT_FILES, kept_files_in
from multilora_studio.adapters.library_errors import LibraryError
from multilora_studio.adapters.private_files import PRIVATE_FILE, tighten
from multilora_studio.util import sha256_file

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20
CHUNK_BYTES = 1 << 20
MAX_READ_BYTES = MAX_MANIFEST_BYTES  # the manifest is the largest single read unpacking makes
SHA256_HEX = 64
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE)  # what every archive holds


@dataclass(frozen=True)
class Entry:
    """One file as the manifest lists it."""

    size: int
    sha256: str


def pack(folder: Path, header: dict, target: Path) -> str:
    """Write ``folder``'s kept files and their manifest (``header`` plus ``files``) to the new
    file ``target``, synced and private; its SHA-256. AdapterError names a file that cannot be
    read."""
    names = kept_files_in(folder)
    missing = [name for name in REQUIRED_FILES if name not in names]
    if missing:  # an archive that cannot be restored as an adapter is never written
        raise AdapterError(f"{folder} has no {' or '.join(missing)}")
    handles = {name: open_adapter_file(folder / name, KEPT_FILES[name]) for name in names}
    try:
        files = {name: _entry_of(handle) for name, handle in handles.items()}
        manifest = {**header, "files": {n: {"bytes": e.size, "sha256": e.sha256} for n, e in files.items()}}
        with open(target, "xb") as raw:
            tighten(target)
            with tarfile.open(fileobj=raw, mode="w:gz") as tar:
                data = json.dumps(manifest, indent=1).encode()
                tar.addfile(_member_info(MANIFEST, len(data)), io.BytesIO(data))
                for name, handle in handles.items():
                    os.lseek(handle, 0, os.SEEK_SET)
                    with open(handle, "rb", closefd=False) as source:
                        tar.addfile(_member_info(name, files[name].size), source)
            raw.flush()
            os.fsync(raw.fileno())
    finally:
        for handle in handles.values():
            os.close(handle)
    return sha256_file(target)


def unpack(archive: Path, staging: Path, name: str) -> None:
    """Unpack ``archive`` into the empty folder ``staging`` (module docstring); LibraryError
    naming what is wrong (``name``: the adapter's, for the message)."""
    where = f"the archive {archive} of {name!r}"
    try:
        with _members(archive) as tar:
            first = tar.next()
            if (
                first is None
                or first.name != MANIFEST
                or not first.isfile()
                or first.size > MAX_MANIFEST_BYTES
            ):
                raise LibraryError(f"{where} does not begin with its manifest; nothing was restored")
            manifest = _manifest(_read(tar, first), where)
            done: set[str] = set()
            while (member := tar.next()) is not None:
                expected = manifest.get(member.name)
                if expected is None or member.name in done:
                    raise LibraryError(
                        f"{where} holds {member.name!r}, which its manifest does not list (or lists "
                        "once); nothing was restored"
                    )
                if not member.isfile() or member.size != expected.size:
                    raise LibraryError(f"{member.name} in {where} is damaged; nothing was restored")
                _write(tar, member, staging / member.name, expected, where)
                done.add(member.name)
    except (tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise LibraryError(f"{where} cannot be read ({error}); nothing was restored") from None
    missing = sorted(set(manifest) - done)
    if missing:
        raise LibraryError(
            f"{where} lacks {', '.join(missing)}, which its manifest lists; nothing was restored"
        )
    absent = [file_name for file_name in REQUIRED_FILES if file_name not in done]
    if absent:
        raise LibraryError(f"{where} holds no {' or '.join(absent)}: no adapter; nothing was restored")


def _entry_of(handle: int) -> Entry:
    digest, size = hashlib.sha256(), 0
    while chunk := os.read(handle, CHUNK_BYTES):
        digest.update(chunk)
        size += len(chunk)
    return Entry(size, digest.hexdigest())


def _member_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(time.time()), PRIVATE_FILE
    return info


def _manifest(data: bytes, where: str) -> dict[str, Entry]:
    """The manifest's files: each a kept file's bare name with a size within its cap and a SHA-256."""
    try:
        files = json.loads(data).get("files")
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, AttributeError):
        files = None
    if not isinstance(files, dict):
        raise LibraryError(f"the manifest of {where} cannot be read; nothing was restored")
    entries = {}
    for file_name, listed in files.items():
        if file_name not in KEPT_FILES:
            raise LibraryError(
                f"the manifest of {where} lists {file_name!r}, which is not a file the library keeps of "
                f"an adapter ({', '.join(KEPT_FILES)}); nothing was restored"
            )
        size, sha256 = (
            (listed.get("bytes"), listed.get("sha256")) if isinstance(listed, dict) else (None, None)
        )
        if not (
            isinstance(size, int)
            and not isinstance(size, bool)
            and 0 <= size <= KEPT_FILES[file_name]
            and isinstance(sha256, str)
            and len(sha256) == SHA256_HEX
        ):
            raise LibraryError(
                f"the manifest of {where} lists {file_name} with {listed!r}, not a size of at most "
                f"{KEPT_FILES[file_name]} bytes and a SHA-256; nothing was restored"
            )
        entries[file_name] = Entry(size, sha256)
    return entries


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    return _open_member(tar, member).read(member.size)


def _write(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, expected: Entry, where: str) -> None:
    """Stream ``member`` to the new private file ``target``, checking its size and SHA-256."""
    source = _open_member(tar, member)
    digest, size = hashlib.sha256(), 0
    with os.fdopen(
        os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE), "wb"
    ) as out:
        os.fchmod(out.fileno(), PRIVATE_FILE)
        while chunk := source.read(CHUNK_BYTES):
            size += len(chunk)
            if size > expected.size:
                break
            digest.update(chunk)
            out.write(chunk)
    if size != expected.size or digest.hexdigest() != expected.sha256:
        raise LibraryError(f"{member.name} in {where} is damaged; nothing was restored")


def _open_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    source = tar.extractfile(member)
    if source is None:  # not a regular file: refused before it is opened
        raise tarfile.ReadError(f"{member.name} is not a regular file")
    return source


@contextmanager
def _members(archive: Path) -> Iterator[tarfile.TarFile]:
    """``archive`` open as a tar file whose reads of the decompressed stream are bounded."""
    with gzip.open(archive, "rb") as raw, tarfile.open(fileobj=_BoundedReads(raw), mode="r:") as tar:
        yield tar


class _BoundedReads(io.RawIOBase):
    """A file whose single reads are at most ``MAX_READ_BYTES``: tarfile reads a GNU long name
    or a pax header whole, as large as its header declares."""

    def __init__(self, raw: gzip.GzipFile) -> None:
        super().__init__()
        self.raw = raw

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > MAX_READ_BYTES:
            raise tarfile.ReadError(f"a member header declares more than {MAX_READ_BYTES} bytes")
        return self.raw.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()
