"""What keeps a library of thousands of adapters quick, checked by behaviour: the indexes its
lookups use (query plans), listing with a fixed number of queries whatever the size, and an
open that does not visit every adapter folder."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

from multilora_studio.adapters.registry import Registry
from multilora_studio.adapters.registry_schema import MIGRATIONS, SCHEMA_VERSION

ALIASES_OF = "SELECT alias FROM aliases WHERE adapter_id = ? ORDER BY alias"
HISTORY_OF = (
    "SELECT * FROM adapter_events WHERE adapter_id IN "
    "(SELECT adapter_id FROM adapter_events WHERE name = ?) ORDER BY id"
)


class CountingRegistry(Registry):
    """A Registry that records every SQL statement its connections run."""

    def __init__(self, root: Path) -> None:
        self.statements: list[str] = []
        super().__init__(root)

    def _new_connection(self) -> sqlite3.Connection:
        conn = super()._new_connection()
        conn.set_trace_callback(self.statements.append)
        return conn


def plan(db: Path, query: str) -> str:
    with sqlite3.connect(db) as conn:
        return " | ".join(row[-1] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}", ("x",)))


def version_6_library(root: Path, adapters: int) -> Path:
    """A library as schema 6 wrote it: adapters, one alias each, their audit log."""
    root.mkdir()
    db = root / "library.sqlite3"
    conn = sqlite3.connect(db)
    for step in range(1, 7):
        conn.executescript(MIGRATIONS[step] + f";PRAGMA user_version = {step};")
    for index in range(adapters):
        conn.execute(
            "INSERT INTO adapters (id, name, source_kind, source, path, base_name, base_digest, rank, "
            "alpha, targets, size_bytes, created) VALUES (?, ?, 'local', '/s', '/p', 'b', '', 4, 8, "
            "'q_proj', 1, 0)",
            (f"id{index}", f"adapter-{index}"),
        )
        conn.execute("INSERT INTO aliases VALUES (?, ?)", (f"alias-{index}", f"id{index}"))
        conn.execute(
            "INSERT INTO adapter_events (time, adapter_id, name, event) VALUES (0, ?, ?, 'registered')",
            (f"id{index}", f"adapter-{index}"),
        )
    conn.commit()
    conn.close()
    return db


def test_a_version_6_library_gains_the_lookup_indexes_and_keeps_everything(tmp_path):
    db = version_6_library(tmp_path / "old", 3)
    assert "SCAN aliases" in plan(db, ALIASES_OF)
    registry = Registry(tmp_path / "old")
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert "USING COVERING INDEX aliases_adapter" in plan(db, ALIASES_OF)
    assert "SCAN adapter_events" not in plan(db, HISTORY_OF)
    assert "adapter_events_name" in plan(db, HISTORY_OF)
    assert [(r.name, r.aliases) for r in registry.list_adapters()] == [
        (f"adapter-{i}", (f"alias-{i}",)) for i in range(3)
    ]
    assert registry.get("alias-2").name == "adapter-2"
    assert [e.event for e in registry.events("adapter-1")] == ["registered"]


def test_listing_runs_the_same_queries_for_3_adapters_as_for_60(tmp_path):
    counts = []
    for size in (3, 60):
        version_6_library(tmp_path / f"lib{size}", size)
        registry = CountingRegistry(tmp_path / f"lib{size}")
        registry.statements.clear()
        records = registry.list_adapters()
        assert len(records) == size and all(r.aliases == (f"alias-{r.name[8:]}",) for r in records)
        counts.append(len(registry.statements))
    assert counts[0] == counts[1]


def test_opening_a_private_library_leaves_its_adapter_folders_unvisited(registry, tiny_adapters, tiny_base):
    record = registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="kept")
    weights = record.path / "adapter_model.safetensors"
    weights.chmod(0o644)  # unreachable for others all the same: its folders are 0700
    Registry(registry.root)
    assert stat.S_IMODE(weights.stat().st_mode) == 0o644
    for folder in (registry.adapters_dir, record.path):  # loose folders: tightened with their contents
        folder.chmod(0o755)
    Registry(registry.root)
    assert stat.S_IMODE(registry.adapters_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(record.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(weights.stat().st_mode) == 0o600


def test_a_restored_adapter_is_private_without_another_open(registry, tiny_adapters, tiny_base):
    registry.import_folder(tiny_adapters["tiny-r4-qv"], tiny_base, name="packed")
    registry.archive("packed")
    restored = registry.restore("packed")
    assert stat.S_IMODE(restored.path.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in restored.path.iterdir()} == {0o600}
