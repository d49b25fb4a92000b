"""Small tmpfs mounts for the full-disk and read-only tests, where this machine allows mounting.

Mounting needs root (CAP_SYS_ADMIN); a CI runner without it skips those tests. Root also
ignores permission bits, so only a read-only mount shows what a read-only disk does.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _can_mount() -> str:
    """'' if a tmpfs can be mounted here, otherwise why not."""
    if shutil.which("mount") is None:
        return "no mount command"
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    probe = tempfile.mkdtemp(prefix="mount-probe-")
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe], capture_output=True, text=True
        )
        if done.returncode != 0:
            return f"mount -t tmpfs is not allowed here: {done.stderr.strip()}"
        subprocess.run(["umount", probe], check=True)
        return ""
    finally:
        os.rmdir(probe)


CANNOT_MOUNT = _can_mount()
needs_mount = pytest.mark.skipif(bool(CANNOT_MOUNT), reason=CANNOT_MOUNT or "mounts allowed")


@contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` (``mount -o size=``) mounted on the new folder ``where``."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def remount(where: Path, read_only: bool) -> None:
    subprocess.run(["mount", "-o", f"remount,{'ro' if read_only else 'rw'}", str(where)], check=True)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until its disk is full; returns it (delete it to free the disk)."""
    filler = folder / "filler"
    handle = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        while True:
            try:
                os.write(handle, b"\0" * 4096)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
                return filler
    finally:
        os.close(handle)
