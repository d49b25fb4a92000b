"""What the library tests share: a consistency check of a library on disk, and the CLI's one line."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from multilora_studio.adapters.registry import Registry
from multilora_studio.cli import main
from multilora_studio.util import sha256_file


def assert_consistent(root: Path) -> Registry:
    """Open the library at ``root``: every local row that is not archived has its complete
    folder, every archived row its archive (its digest that of the row), every folder and
    every archive its row."""
    registry = Registry(root)
    records = registry.list_adapters()
    archived = [r for r in records if r.state == "archived"]
    local = {r.id for r in records if r.source_kind == "local" and r.state != "archived"}
    assert sorted(p.name for p in registry.adapters_dir.iterdir()) == sorted(local)
    archives = (
        sorted(p.name for p in registry.archives_dir.iterdir()) if registry.archives_dir.exists() else []
    )
    assert archives == sorted(r.archive_path.name for r in archived if r.archive_path is not None)
    for record in records:
        if record.state == "archived":
            assert (
                record.archive_path is not None and sha256_file(record.archive_path) == record.archive_sha256
            )
            continue
        found = sorted(p.name for p in record.path.iterdir()) if record.path.is_dir() else None
        latest = registry.events(record.name)[-6:]
        assert (record.path / "adapter_config.json").is_file(), (record, found, latest)
        assert (record.path / "adapter_model.safetensors").stat().st_size == record.size_bytes
    names = [name for r in records for name in (r.name, *r.aliases)]
    assert len(names) == len(set(names))
    return registry


def private_modes(root: Path) -> dict[str, str]:
    """``{path: octal mode}`` of the library's folders and files that are not 0700 / 0600."""
    loose = {}
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode != (0o700 if path.is_dir() else 0o600):
            loose[str(path.relative_to(root))] = oct(mode)
    return loose


def cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """Run ``multilora-studio ARGV`` in this process: exit code, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys: pytest.CaptureFixture, *argv: str) -> str:
    """The single ``error:`` line of a failed command (no traceback), without its prefix."""
    code, _, err = cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and "Traceback" not in err, err
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, err
    return errors[0].removeprefix("error: ")
