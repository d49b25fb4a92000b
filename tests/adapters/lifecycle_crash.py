"""A child process that archives an adapter and kills itself (SIGKILL) at one point of it:
``python -m tests.adapters.lifecycle_crash LIBRARY NAME POINT``."""

from __future__ import annotations

import os
import signal
import sys
import tarfile
from pathlib import Path
from unittest import mock

from multilora_studio.adapters import library_moves, registry_lifecycle
from multilora_studio.adapters.registry import Registry


def die(*_args, **_kwargs) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    root, name, point = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    registry = Registry(root)
    real_addfile = tarfile.TarFile.addfile
    added: list[str] = []

    def add_then_die(self, info, *args, **kwargs):  # mid-write: the manifest and one file are in
        real_addfile(self, info, *args, **kwargs)
        added.append(info.name)
        if len(added) == 2:
            die()

    real_rename = library_moves.Moves.rename

    def rename_then_die(self, source, target):  # the archive in place, its row not committed yet
        real_rename(self, source, target)
        if str(target).endswith(".tar.gz"):
            die()

    patches = {
        "writing": mock.patch.object(tarfile.TarFile, "addfile", add_then_die),
        "renamed": mock.patch.object(library_moves.Moves, "rename", rename_then_die),
        "recorded": mock.patch.object(registry_lifecycle.shutil, "rmtree", die),  # before the folder goes
    }
    with patches[point]:
        registry.archive(name, "crash test")


if __name__ == "__main__":
    main()
