"""Library writes killed with kill -9: nothing half-written (the disk tests are in
``test_library_disks.py``). A separate process writes the library in a loop and is killed
with SIGKILL in the middle of each kind of write.
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
from tests.security.library_checks import assert_consistent

REPO_ROOT = Path(__file__).resolve().parents[2]
# the writer's steps a kill lands in (a killed archive: tests/adapters/test_lifecycle.py)
WRITER_STEPS = ("import", "rename", "alias", "pin", "restore", "register", "remove")
GUARD_S = 300.0  # a worker that never reaches a step fails the test instead of hanging it


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
