"""Library writes against a full disk, a read-only disk and kill -9: one line, nothing half-written.

The disk tests mount small tmpfs file systems and skip where mounting is not allowed
(a CI runner that is not root). The kill tests need no mount: a separate process writes the
library in a loop and is killed with SIGKILL in the middle of each kind of write.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.library_sweep import STAGING_PREFIX, TRASH_PREFIX
from multilora_studio.adapters.registry import Registry
from multilora_studio.cli.shared import describe_base
from tests.security.library_checks import assert_consistent, cli, one_line_error
from tests.security.mounts import fill, needs_mount, remount, tmpfs

REPO_ROOT = Path(__file__).resolve().parents[2]
DISK_SIZE = "8m"
WRITER_STEPS = ("import", "rename", "alias", "pin", "register", "remove")
GUARD_S = 300.0  # a worker that never reaches a step fails the test instead of hanging it


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


def start_writer(root: Path, base: BaseModelRef, source: Path, label: str) -> subprocess.Popen:
    fields = json.dumps(dataclasses.asdict(base))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.security.library_writer", str(root), fields, str(source), label],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_step(writer: subprocess.Popen, wanted: str) -> None:
    """Read the writer's steps until it starts ``wanted``."""
    assert writer.stdout is not None
    for line in writer.stdout:
        if line.strip() == wanted:
            return
    pytest.fail(f"the writer ended before {wanted!r}: {writer.communicate()[1]}")


def wait_for_entry(writer: subprocess.Popen, folder: Path, prefix: str) -> None:
    """Watch ``folder`` until a ``prefix*`` entry (an import's staging, a removal's trash) appears."""
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline and writer.poll() is None:
        if any(entry.name.startswith(prefix) for entry in os.scandir(folder)):
            return
    pytest.fail(f"no {prefix}* entry appeared in {folder}")


KILL_POINTS = [
    *(("step", step) for step in WRITER_STEPS),
    ("entry", STAGING_PREFIX),  # in the middle of copying an import
    ("entry", TRASH_PREFIX),  # in the middle of deleting a removed adapter's files
]


def test_kill_9_during_every_library_write_leaves_it_consistent(tmp_path, tiny_adapters, tiny_model_dir):
    root = tmp_path / "library"
    Registry(root)
    source = tiny_adapters["tiny-r4-qv"]
    base = describe_base(str(tiny_model_dir))
    shuffle = random.Random(25)
    for number, (kind, what) in enumerate(KILL_POINTS):
        writer = start_writer(root, base, source, f"run{number}")
        try:
            if kind == "step":
                wait_for_step(writer, what)
                time.sleep(shuffle.uniform(0, 0.02))  # somewhere inside that write
            else:
                wait_for_step(writer, "import")
                wait_for_entry(writer, root / "adapters", what)
            writer.send_signal(signal.SIGKILL)
        finally:
            writer.kill()
            writer.communicate()
        assert writer.returncode == -signal.SIGKILL, (kind, what)
        assert_consistent(root)
    registry = assert_consistent(root)
    record = registry.import_folder(source, base, name="after-the-kills")
    assert record.path.is_dir() and registry.get("after-the-kills").id == record.id
    assert_consistent(root)


def test_a_removal_killed_before_its_commit_is_put_back(tmp_path, tiny_adapters, tiny_model_dir):
    """The state a kill between moving the folder to the trash and the commit leaves: row, no folder."""
    registry = Registry(tmp_path / "library")
    record = registry.import_folder(tiny_adapters["tiny-r4-qv"], describe_base(str(tiny_model_dir)))
    os.replace(record.path, registry.adapters_dir / f"{TRASH_PREFIX}{record.id}")
    staging = registry.adapters_dir / f"{STAGING_PREFIX}killed-import"
    staging.mkdir()
    reopened = assert_consistent(registry.root)
    assert reopened.get(record.name).path.is_dir() and not staging.exists()
