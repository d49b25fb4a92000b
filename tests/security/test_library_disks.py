"""The library on a full disk and a read-only disk: one line, nothing half-written, and a
read-only library still lists.

The tests mount small tmpfs file systems and skip where mounting is not allowed (a CI runner
that is not root).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from multilora_studio.adapters.library_errors import StorageError
from multilora_studio.adapters.registry import Registry
from tests.security.library_checks import assert_consistent, cli, one_line_error
from tests.security.mounts import fill, needs_mount, remount, tmpfs

DISK_SIZE = "8m"


@pytest.fixture
def disk(tmp_path: Path):
    with tmpfs(tmp_path / "disk", DISK_SIZE) as where:
        yield where


@pytest.fixture
def home(disk: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = disk / "studio-home"
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(folder))
    return folder


def names(capsys: pytest.CaptureFixture) -> list[str]:
    code, out, err = cli(capsys, "adapters", "list", "--json")
    assert code == 0, err
    return [record["name"] for record in json.loads(out)]


def add(capsys: pytest.CaptureFixture, folder: Path, model: Path, name: str) -> tuple[int, str, str]:
    return cli(capsys, "adapters", "add", str(folder), "--model", str(model), "--name", name)


@needs_mount
def test_a_full_disk_fails_an_import_in_one_line_and_changes_nothing(
    capsys, disk, home, tiny_adapters, tiny_model_dir
):
    assert add(capsys, tiny_adapters["tiny-r4-qv"], tiny_model_dir, "kept")[0] == 0
    before = sorted(p.name for p in (home / "adapters").iterdir())
    filler = fill(disk)
    message = one_line_error(
        capsys, "adapters", "add", str(tiny_adapters["tiny-r8-all"]), "--model", str(tiny_model_dir)
    )
    assert "no space left on device" in message and str(home) in message, message
    assert message.endswith("nothing was changed")
    assert names(capsys) == ["kept"]  # listing still works on the full disk
    assert sorted(p.name for p in (home / "adapters").iterdir()) == before
    filler.unlink()
    assert_consistent(home)
    assert add(capsys, tiny_adapters["tiny-r8-all"], tiny_model_dir, "after")[0] == 0
    assert names(capsys) == ["after", "kept"]


@needs_mount
def test_a_disk_that_fills_during_the_copy_fails_the_import_in_one_line_and_changes_nothing(
    capsys, disk, home, tiny_adapters, tiny_model_dir
):
    """Room for the library's database but not for the adapter's weights: the copy itself
    fails, and the message says where."""
    assert add(capsys, tiny_adapters["tiny-r4-qv"], tiny_model_dir, "kept")[0] == 0
    before = sorted(p.name for p in (home / "adapters").iterdir())
    source = tiny_adapters["tiny-r8-all"]
    filler = fill(disk)
    room = (source / "adapter_model.safetensors").stat().st_size // 2
    os.truncate(filler, filler.stat().st_size - room)
    message = one_line_error(capsys, "adapters", "add", str(source), "--model", str(tiny_model_dir))
    assert message.startswith(f"no space left on device while copying {source}"), message
    assert message.endswith(f"into the library {home}; nothing was changed"), message
    assert sorted(p.name for p in (home / "adapters").iterdir()) == before  # no staging copy left
    filler.unlink()
    assert names(capsys) == ["kept"]
    assert_consistent(home)


@needs_mount
def test_a_read_only_disk_still_lists_and_refuses_every_write_in_one_line(
    capsys, disk, home, tiny_adapters, tiny_model_dir
):
    assert add(capsys, tiny_adapters["tiny-r4-qv"], tiny_model_dir, "kept")[0] == 0
    remount(disk, read_only=True)
    try:
        opened = Registry(home)
        assert opened.read_only
        assert names(capsys) == ["kept"]
        writes = [
            ["adapters", "add", str(tiny_adapters["tiny-r8-all"]), "--model", str(tiny_model_dir)],
            ["adapters", "remove", "kept"],
            ["adapters", "rename", "kept", "renamed"],
            ["adapters", "pin", "kept"],
            ["pull", "studio-tests/tiny-lora"],
        ]
        for argv in writes:
            message = one_line_error(capsys, *argv)
            assert str(home) in message and "read-only" in message, (argv, message)
            assert message.endswith("nothing was changed"), (argv, message)
        with pytest.raises(StorageError) as refused:  # an open library tries again, and stays read-only
            opened.set_pinned("kept")
        assert str(refused.value) == (
            f"the adapter library {home} can only be read (read-only file system); nothing was changed"
        )
        assert opened.read_only and opened.get("kept").pinned is False
    finally:
        remount(disk, read_only=False)
    registry = assert_consistent(home)
    assert [(r.name, r.pinned) for r in registry.list_adapters()] == [("kept", False)]
    assert opened.set_pinned("kept").pinned and not opened.read_only  # writable again once remounted


@needs_mount
def test_a_read_only_disk_without_a_library_is_one_line(capsys, disk, home):
    remount(disk, read_only=True)
    try:
        message = one_line_error(capsys, "adapters", "list")
    finally:
        remount(disk, read_only=False)
    assert (
        message == f"read-only file system while opening the adapter library in {home}; nothing was changed"
    )
