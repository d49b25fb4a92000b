"""The adapter lifecycle on a real SQLite library: retire (listed, not served), reactivate,
archive (one compressed file with a manifest; the folder freed), restore (byte-identical files),
remove; every transition in the audit log, which outlives the adapter; an archive interrupted by
a killed process at any point loses nothing when the library is opened again."""

from __future__ import annotations

import itertools
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from multilora_studio.adapters.pull import pull
from multilora_studio.adapters.registry import LibraryError, Registry
from multilora_studio.cli import main
from multilora_studio.util import sha256_file
from tests.adapter_fixtures import HUB_ORG

ROOT = Path(__file__).resolve().parents[2]


def digests(folder: Path) -> dict[str, str]:
    return {path.name: sha256_file(path) for path in sorted(folder.iterdir()) if path.is_file()}


def test_retire_archive_restore_remove_with_the_audit_log(registry, tiny_adapters, tiny_base, engine):
    record = registry.import_folder(tiny_adapters["tiny-r8-all"], tiny_base, name="worn", max_rank=32)
    before = digests(record.path)
    assert record.state == "active"

    assert registry.retire("worn", "superseded by v2").state == "retired"
    with pytest.raises(LibraryError, match=r"'worn' is retired, not served; .*adapters reactivate worn"):
        registry.load_into(engine, "worn")
    assert "worn" not in {info.name for info in engine.list_adapters()}
    with pytest.raises(LibraryError, match="only a active adapter can be retired"):
        registry.retire("worn")

    archived = registry.archive("worn", "cold for 90 days")
    assert archived.state == "archived" and not record.path.exists()
    assert archived.archive_path is not None and archived.archive_sha256 == sha256_file(archived.archive_path)
    with tarfile.open(archived.archive_path) as tar:
        assert sorted(tar.getnames()) == sorted(["manifest.json", *before])
    with pytest.raises(LibraryError, match=r"archived, not served; .*adapters restore worn"):
        registry.load_into(engine, "worn")

    restored = registry.restore("worn", "audit request")
    assert restored.state == "retired" and digests(restored.path) == before  # byte for byte
    assert not archived.archive_path.exists()
    registry.reactivate("worn", "back in service")
    registry.load_into(engine, "worn")
    engine.remove_adapter("worn")
    registry.remove("worn")

    events = registry.events("worn")
    assert [e.event for e in events] == [
        "registered",
        "retired",
        "archived",
        "restored",
        "reactivated",
        "removed",
    ]
    assert [e.reason for e in events][1:5] == [
        "superseded by v2",
        "cold for 90 days",
        "audit request",
        "back in service",
    ]
    assert all(a.time <= b.time for a, b in itertools.pairwise(events))
    assert registry.find("worn") is None and Registry(registry.root).events("worn") == events  # kept on disk


def test_a_damaged_archive_is_refused_and_the_adapter_stays_archived(registry, tiny_adapters, tiny_base):
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="fragile", max_rank=32)
    archived = registry.archive("fragile")
    with open(archived.archive_path, "r+b") as handle:
        handle.seek(40)
        handle.write(b"\x00" * 16)
    with pytest.raises(LibraryError, match="does not match its digest"):
        registry.restore("fragile")
    assert registry.get("fragile").state == "archived" and archived.archive_path.exists()


def test_a_folder_without_its_config_is_not_archived(registry, tiny_adapters, tiny_base):
    record = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="gutted", max_rank=32)
    (record.path / "adapter_config.json").unlink()
    with pytest.raises(ValueError, match=r"has no adapter_config\.json"):
        registry.archive("gutted")
    after = registry.get("gutted")
    assert after.state == "active" and after.archive_path is None and record.path.is_dir()
    assert not registry.archives_dir.exists() or not any(registry.archives_dir.iterdir())


@pytest.mark.parametrize("point", ["writing", "renamed", "recorded"])
def test_a_killed_archive_loses_nothing(point, registry, tiny_adapters, tiny_base):
    record = registry.import_folder(tiny_adapters["tiny-r16-mlp"], tiny_base, name="kept", max_rank=32)
    before = digests(record.path)
    child = subprocess.run(
        [sys.executable, "-m", "tests.adapters.lifecycle_crash", str(registry.root), "kept", point],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    again = Registry(registry.root)  # opening sweeps what the crash left
    kept = again.get("kept")
    archives = sorted(p.name for p in again.archives_dir.iterdir())
    if point == "recorded":  # the row said archived before the kill: the archive is the copy
        assert kept.state == "archived" and kept.archive_path is not None
        assert archives == [kept.archive_path.name]
        kept = again.restore("kept")
    else:  # not recorded: the folder is the copy, no archive or partial file remains
        assert kept.state == "active" and archives == []
    assert digests(kept.path) == before


def test_the_lifecycle_from_the_command_line(capsys, monkeypatch, tmp_path, tiny_adapters, tiny_base):
    monkeypatch.setenv("MULTILORA_STUDIO_HOME", str(tmp_path / "home"))
    Registry().import_folder(tiny_adapters["tiny-r8-attn"], tiny_base, name="cli-one", max_rank=32)
    assert main(["adapters", "retire", "cli-one", "--reason", "replaced"]) == 0
    assert capsys.readouterr().out.strip() == "cli-one: retired"
    assert main(["adapters", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["cli-one", "retired"]
    assert main(["adapters", "archive", "cli-one"]) == 0
    assert capsys.readouterr().out.startswith("cli-one: archived (")
    assert main(["adapters", "restore", "cli-one"]) == 0 and "retired" in capsys.readouterr().out
    assert main(["adapters", "restore", "cli-one"]) == 1  # not archived any more: a clear error
    assert capsys.readouterr().err.strip() == "error: 'cli-one' is retired, not archived"
    assert main(["adapters", "reactivate", "cli-one"]) == 0
    assert capsys.readouterr().out.strip() == "cli-one: active"
    assert main(["adapters", "history", "cli-one"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[3] for line in lines] == [
        "registered",
        "retired",
        "archived",
        "restored",
        "reactivated",
    ]
    assert lines[1].endswith("(replaced)")


def test_a_hub_adapter_archives_its_files_not_the_caches_links(hub, hub_env, registry, tiny_base):
    adapter = pull(f"{HUB_ORG}/tiny-r8-all", registry, tiny_base, name="from-hub").adapter
    assert any(p.is_symlink() for p in adapter.path.iterdir())  # the HF cache's snapshot links
    before = digests(adapter.path)
    archived = registry.archive("from-hub")
    with tarfile.open(archived.archive_path) as tar:
        assert all(member.isfile() for member in tar.getmembers())  # the files, dereferenced
    assert adapter.path.exists()  # the shared cache is left alone
    restored = registry.restore("from-hub")
    assert digests(restored.path) == before and restored.state == "retired"
