"""An adapter's life in the library after it is registered: retired (not served, still listed),
archived (its files packed into one compressed archive with a manifest of SHA-256s, the folder
freed), restored (the files unpacked byte for byte and checked against the manifest), removed;
every transition recorded with its time and reason in an audit log that outlives the adapter.

Archiving and restoring never lose files. Each holds the library's writers' lock
(``library_sweep``) from its first file to its last and works under names of its own (an
archive is packed and synced as a staging file, a restore unpacked into a staging folder);
the row then changes and the files move into place (the folder aside) in one transaction,
which first checks that no other archive, restore or removal of the adapter committed since
it began (its files may have moved under it: nothing changes), and undoes the moves if it
does not commit.
Only then is what was moved aside deleted. So a crash at any point leaves the row pointing at
a complete copy, the folder or the archive, and the leftovers are swept at the next open.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multilora_studio.adapters.adapter_archive import pack, unpack
from multilora_studio.adapters.adapter_files import AdapterError
from multilora_studio.adapters.library_errors import LibraryError
from multilora_studio.adapters.library_moves import moving
from multilora_studio.adapters.library_sweep import STAGING_PREFIX, trash_name, writing
from multilora_studio.adapters.private_files import make_private_dir
from multilora_studio.adapters.registry_schema import ADAPTER_SELECT, AdapterRecord, EvalScoreRecord
from multilora_studio.util import sha256_file

ARCHIVES_DIR = "archives"
ACTIVE, RETIRED, ARCHIVED = "active", "retired", "archived"


def not_served_because(
    record: AdapterRecord, latest: EvalScoreRecord | None, min_pass_rate: float | None
) -> str | None:
    """Why the library does not serve ``record`` (None: it does): retired or archived, or its
    newest evaluation with counts (``latest``: ``Registry.latest_eval_scores(counted=True)``)
    passed fewer prompts than ``min_pass_rate`` (the quality gate; an adapter never evaluated
    passes it, see ``unjudged_because``)."""
    if record.state != ACTIVE:
        return record.state
    if latest is None or min_pass_rate is None:
        return None
    rate = latest.pass_rate
    if rate is not None and rate < min_pass_rate:
        return (
            f"its last evaluation ({latest.prompt_set}) passed {rate:.0%}, "
            f"below the gate's {min_pass_rate:.0%}"
        )
    return None


# (the alias's adapter id, alias, a listed adapter's name) of every warm list; callers add a
# WHERE on s.adapter_id and order by alias and position
ALIAS_WARM_QUERY = (
    "SELECT s.adapter_id, w.alias, a.name FROM alias_warm w "
    "JOIN aliases s ON s.alias = w.alias JOIN adapters a ON a.id = w.adapter_id"
)


def alias_warm_lists(rows: Iterable[Sequence[Any]]) -> dict[str, tuple[tuple[str, tuple[str, ...]], ...]]:
    """``ALIAS_WARM_QUERY``'s rows (in alias and position order) by the aliases' adapter:
    ((alias, its listed adapters), ...)."""
    lists: dict[str, dict[str, list[str]]] = {}
    for adapter_id, alias, name in rows:
        lists.setdefault(adapter_id, {}).setdefault(alias, []).append(name)
    return {
        adapter_id: tuple((alias, tuple(names)) for alias, names in aliases.items())
        for adapter_id, aliases in lists.items()
    }


def unjudged_because(
    counted: EvalScoreRecord | None, newest: EvalScoreRecord | None, min_pass_rate: float | None
) -> str | None:
    """Why the quality gate lets an adapter through without judging it although it has scores:
    they carry no counts (a model card's metrics), so there is no pass rate to compare; None
    when the gate is off, judged a score with counts, or there is no score at all. ``counted``
    and ``newest``: its newest score with counts and its newest of all."""
    if min_pass_rate is None or counted is not None or newest is None:
        return None
    return f"its scores carry no counts ({newest.label}), so the gate has no pass rate to judge"


@dataclass(frozen=True)
class AdapterEvent:
    """One transition of an adapter: registered, retired, reactivated, archived, restored, removed."""

    time: float
    name: str
    adapter_id: str
    event: str
    reason: str


class RegistryLifecycle:
    """The lifecycle half of ``Registry`` (its connections and records)."""

    root: Path
    adapters_dir: Path
    lock_path: Path

    def get(self, name: str) -> AdapterRecord:  # pragma: no cover - Registry's
        raise NotImplementedError

    def check_writable(self) -> None:  # pragma: no cover - Registry's
        raise NotImplementedError

    def _record(self, conn: sqlite3.Connection, row: sqlite3.Row) -> AdapterRecord:  # pragma: no cover
        raise NotImplementedError

    def _write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:  # pragma: no cover
        raise NotImplementedError

    def _connect(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:  # pragma: no cover
        raise NotImplementedError

    def _row(self, conn: sqlite3.Connection, name: str) -> sqlite3.Row | None:  # pragma: no cover
        raise NotImplementedError

    @property
    def archives_dir(self) -> Path:
        return self.root / ARCHIVES_DIR

    def owns_folder(self, record: AdapterRecord) -> bool:
        """Whether the library made ``record``'s folder (an import's copy: its to delete); a Hub
        snapshot belongs to the shared HF cache."""
        return record.source_kind == "local" and record.path.parent == self.adapters_dir

    # ---------------------------------------------------------------- the audit log

    @staticmethod
    def record_event(conn: sqlite3.Connection, adapter_id: str, name: str, event: str, reason: str) -> None:
        """Add a transition to the audit log inside the caller's transaction."""
        conn.execute(
            "INSERT INTO adapter_events (time, adapter_id, name, event, reason) VALUES (?, ?, ?, ?, ?)",
            (time.time(), adapter_id, name, event, reason),
        )

    def events(self, name: str | None = None) -> list[AdapterEvent]:
        """The audit log, oldest first; of one adapter (by the names it had) when ``name`` is given."""
        with self._connect() as conn:
            if name is None:
                rows = conn.execute("SELECT * FROM adapter_events ORDER BY id").fetchall()
            else:
                rows = conn.execute(
                    "SELECT * FROM adapter_events WHERE adapter_id IN "
                    "(SELECT adapter_id FROM adapter_events WHERE name = ?) ORDER BY id",
                    (name,),
                ).fetchall()
        return [AdapterEvent(r["time"], r["name"], r["adapter_id"], r["event"], r["reason"]) for r in rows]

    # ---------------------------------------------------------------- transitions

    def retire(self, name: str, reason: str = "") -> AdapterRecord:
        """Stop serving ``name`` (it leaves GPU slots and host RAM at the next engine start or
        reload); it stays listed with its files."""
        return self._transition(name, (ACTIVE,), RETIRED, "retired", reason)

    def set_warm(self, name: str, warm: bool = True) -> AdapterRecord:
        """Read ``name`` into host RAM whenever an engine starts, before any request needs it."""
        record = self.get(name)
        with self._write() as conn:
            conn.execute("UPDATE adapters SET warm = ? WHERE id = ?", (int(warm), record.id))
            self.record_event(conn, record.id, record.name, "warm" if warm else "not warm", "")
        return self.get(record.name)

    def set_alias_warm(self, alias: str, names: Sequence[str]) -> AdapterRecord:
        """Read ``names`` (adapters, by name or alias) into host RAM when a request first uses
        ``alias`` after its engine started; an empty list clears it. All or nothing; returns
        the alias's adapter (``alias_warm`` lists it)."""
        with self._write() as conn:
            owner = self._row(conn, alias)
            if owner is None or owner["name"] == alias:
                raise LibraryError(
                    f"no alias {alias!r} in the library (give an adapter one: --alias, or Add alias… "
                    "in the Library)"
                )
            ids: list[str] = []
            for name in names:
                row = self._row(conn, name)
                if row is None:
                    raise LibraryError(f"no adapter named {name!r} in the library; nothing changed")
                if row["id"] not in ids:
                    ids.append(row["id"])
            conn.execute("DELETE FROM alias_warm WHERE alias = ?", (alias,))
            conn.executemany(
                "INSERT INTO alias_warm (alias, adapter_id, position) VALUES (?, ?, ?)",
                [(alias, adapter_id, position) for position, adapter_id in enumerate(ids)],
            )
            listed = ", ".join(names) or "none"
            self.record_event(conn, owner["id"], owner["name"], "warm on alias", f"{alias}: {listed}")
        return self.get(alias)

    def reactivate(self, name: str, reason: str = "") -> AdapterRecord:
        """Serve a retired adapter again."""
        return self._transition(name, (RETIRED,), ACTIVE, "reactivated", reason)

    def _transition(
        self, name: str, sources: tuple[str, ...], target: str, event: str, reason: str
    ) -> AdapterRecord:
        record = self.get(name)
        if record.state not in sources:
            raise LibraryError(
                f"{record.name!r} is {record.state}; only a {' or '.join(sources)} adapter can be {event}"
            )
        with self._write() as conn:
            conn.execute("UPDATE adapters SET state = ? WHERE id = ?", (target, record.id))
            self.record_event(conn, record.id, record.name, event, reason)
        return self.get(record.name)

    def archive(self, name: str, reason: str = "") -> AdapterRecord:
        """Pack a retired (or active) adapter's files into ``archives/ID.TOKEN.tar.gz`` with their
        manifest, then free the folder (an imported copy; a Hub snapshot stays in the HF cache)."""
        record = self.get(name)
        if record.state == ARCHIVED:
            raise LibraryError(f"{record.name!r} is archived already")
        if not record.path.is_dir():
            raise LibraryError(f"{record.name!r}: its folder {record.path} is missing; nothing to archive")
        self.check_writable()
        token = uuid.uuid4().hex  # each write's own names: two archives of one adapter never meet
        final = self.archives_dir / f"{record.id}.{token}.tar.gz"
        partial = self.archives_dir / f"{STAGING_PREFIX}{token}.tar.gz"
        trash = trash_name(record.path, token)
        with writing(self.lock_path):
            make_private_dir(self.archives_dir)
            generation = self._files_generation(record)
            if generation is None:
                raise LibraryError(f"{record.name!r} was archived or removed meanwhile; nothing changed")
            try:
                try:
                    header = {"name": record.name, "id": record.id, "folder": str(record.path)}
                    digest = pack(record.path, header, partial)
                except (FileNotFoundError, AdapterError):
                    if self._files_generation(record) == generation and record.path.is_dir():
                        raise  # nothing happened to the folder: one of its files cannot be read
                    raise LibraryError(
                        f"{record.name!r}: its files went away while they were packed (archived or "
                        "removed meanwhile); nothing changed"
                    ) from None
                with moving(self._write()) as (conn, moves):
                    if self._files_generation(record, conn) != generation:
                        raise LibraryError(
                            f"{record.name!r} was archived, restored or removed meanwhile; nothing changed"
                        )
                    conn.execute(
                        "UPDATE adapters SET state = ?, archive_path = ?, archive_sha256 = ? WHERE id = ?",
                        (ARCHIVED, str(final), digest, record.id),
                    )
                    self.record_event(conn, record.id, record.name, "archived", reason)
                    moves.rename(partial, final)
                    if self.owns_folder(record):
                        moves.rename(record.path, trash)
            finally:
                partial.unlink(missing_ok=True)
            shutil.rmtree(trash, ignore_errors=True)
        return self.get(record.name)

    def restore(self, name: str, reason: str = "") -> AdapterRecord:
        """Unpack an archived adapter where its folder was, each file checked against the
        manifest; it comes back retired (reactivate it to serve it)."""
        record = self.get(name)
        archive = record.archive_path
        if record.state != ARCHIVED or archive is None:
            raise LibraryError(f"{record.name!r} is {record.state}, not archived")
        self.check_writable()
        token = uuid.uuid4().hex
        staging = record.path.with_name(f"{STAGING_PREFIX}{token}")
        trash = trash_name(record.path, token)
        with writing(self.lock_path):
            staging.parent.mkdir(parents=True, exist_ok=True)
            make_private_dir(staging)
            try:
                try:
                    if sha256_file(archive) != record.archive_sha256:
                        raise LibraryError(
                            f"the archive {archive} of {record.name!r} does not match its digest"
                        )
                    unpack(archive, staging, record.name)
                except FileNotFoundError:
                    raise LibraryError(
                        f"the archive {archive} of {record.name!r} is gone (restored or removed meanwhile, "
                        "or deleted); nothing changed"
                    ) from None
                with moving(self._write()) as (conn, moves):
                    now = self._current(conn, record.id)
                    if now is None or now.archive_path != archive:
                        raise LibraryError(
                            f"{record.name!r} was restored or removed meanwhile; nothing changed"
                        )
                    conn.execute(
                        "UPDATE adapters SET state = ?, archive_path = NULL, archive_sha256 = NULL "
                        "WHERE id = ?",
                        (RETIRED, record.id),
                    )
                    self.record_event(conn, record.id, record.name, "restored", reason)
                    if os.path.lexists(record.path):  # a Hub snapshot left in place: the archive is the truth
                        moves.rename(record.path, trash)
                    moves.rename(staging, record.path)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(trash, ignore_errors=True)
            archive.unlink(missing_ok=True)
        return self.get(record.name)

    def _files_generation(self, record: AdapterRecord, conn: sqlite3.Connection | None = None) -> int | None:
        """The audit log's newest archive or restore of ``record``'s adapter, which changes with
        every move of its files (0: none yet); None when it is removed or archived, so that an
        archive sees whether the folder it packs stayed the one it found (in ``conn``'s
        transaction, else a read of its own)."""
        if conn is None:
            with self._connect() as own:
                return self._files_generation(record, own)
        now = self._current(conn, record.id)
        if now is None or now.state == ARCHIVED:
            return None
        row = conn.execute(
            "SELECT max(id) FROM adapter_events WHERE adapter_id = ? AND event IN ('archived', 'restored')",
            (record.id,),
        ).fetchone()
        return row[0] or 0

    def _current(self, conn: sqlite3.Connection, adapter_id: str) -> AdapterRecord | None:
        """The adapter's record as the transaction of ``conn`` sees it (None: it was removed)."""
        row = conn.execute(ADAPTER_SELECT + " WHERE id = ?", (adapter_id,)).fetchone()
        return None if row is None else self._record(conn, row)
