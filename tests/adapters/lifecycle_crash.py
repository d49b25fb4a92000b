"""A child process that archives an adapter and kills itself (SIGKILL) at one point of it:
``python -m tests.adapters.lifecycle_crash LIBRARY NAME POINT``."""

from __future__ import annotations

import os
import signal
import sys
import tarfile
from pathlib import Path
from unittest import mock

from multilora_studio.adapters import registry_lifecycle
from multilora_studio.adapters.registry import Registry


def die(*_args, **_kwargs) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    root, name, point = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    registry = Registry(root)
    real_add = tarfile.TarFile.add
    added: list[str] = []

    def add_then_die(self, path, *args, **kwargs):  # mid-write: one file is in the partial archive
        real_add(self, path, *args, **kwargs)
        added.append(str(path))
        die()

    real_digest = registry_lifecycle.sha256_file

    def digest_or_die(path):  # the archive is in place, its row not updated yet
        if str(path).endswith(".tar.gz"):
            die()
        return real_digest(path)

    patches = {
        "writing": mock.patch.object(tarfile.TarFile, "add", add_then_die),
        "renamed": mock.patch.object(registry_lifecycle, "sha256_file", digest_or_die),
        "recorded": mock.patch.object(registry_lifecycle.shutil, "rmtree", die),  # before the folder goes
    }
    with patches[point]:
        registry.archive(name, "crash test")


if __name__ == "__main__":
    main()
