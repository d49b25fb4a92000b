"""The adapter library: one SQLite file in the user data directory and the imported folders.

Layout under ``root`` (the user data directory by default)::

    library.sqlite3          adapters, aliases, base models pulled from the Hub, eval scores
    library.lock             held (shared) by every write that moves files, see ``library_sweep``
    adapters/<id>/           imported adapter folders (copies; Hub pulls stay in the HF cache)
    adapters/.tmp-<token>/   an import or a restore in progress, renamed to <id> as its row commits
    adapters/.trash-<id>.<token>/  a folder moved aside by a removal or an archive as its row
                             commits, deleted then
    archives/<id>.<token>.tar.gz   an archived adapter's files (``registry_lifecycle``)

Every operation opens its own connection (WAL journal, busy timeout), and every
write is one ``BEGIN IMMEDIATE`` transaction, so GUI, server and engine threads and
other processes can share the library. A failed import or pull leaves no row and
no folder; what a crash (kill -9) leaves is swept when the library is next opened
(``library_sweep``). The library is private: folders 0700, files 0600; a folder found
loose (a chmod, an older version) is tightened with its contents on the next open
(``private_files``). An import copies only the regular files of the folder
and refuses links, pipes and devices. A full, read-only or unwritable disk is a
one-line StorageError and changes nothing; a library that cannot be written is
opened read-only, so it can still be listed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from multilora_studio.adapters.adapter_config import WEIGHTS_FILE, AdapterError, read_adapter_config
from multilora_studio.adapters.adapter_tokenizer import tokenizer_files_label
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.base_quantization import BaseQuantization, base_quantization_of, serving_note
from multilora_studio.adapters.kept_files import KEPT_FILES, check_kept_files, kept_files_in
from multilora_studio.adapters.library_errors import (
    LibraryError,
    NameTaken,
    StorageError,
    cause_of,
    storage_error,
    unwritable,
)
from multilora_studio.adapters.library_moves import moving
from multilora_studio.adapters.library_sweep import (
    LOCK_FILE,
    STAGING_PREFIX,
    NamedByRows,
    sweep,
    trash_name,
    writing,
)
from multilora_studio.adapters.private_files import (
    copy_regular_file,
    create_private_file,
    make_private_dir,
    refusal,
    tighten,
    tighten_tree,
)
from multilora_studio.adapters.registry_lifecycle import (
    ALIAS_WARM_QUERY,
    ARCHIVED,
    RegistryLifecycle,
    alias_warm_lists,
    not_served_because,
    unjudged_because,
)
from multilora_studio.adapters.registry_runs import RegistryRuns
from multilora_studio.adapters.registry_schema import (
    ADAPTER_SELECT,
    AdapterRecord,
    BaseModelRecord,
    EvalScoreRecord,
    insert_score,
    migrate,
)
from multilora_studio.adapters.score_import import MODEL_CARD, read_model_card
from multilora_studio.paths import data_dir_path

log = logging.getLogger(__name__)

DB_FILE = "library.sqlite3"
ADAPTERS_DIR = "adapters"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")  # the engine's adapter-name rule
RESERVED_NAMES = ("base",)
DEFAULT_MAX_RANK = 64
MERGED_REVISION = "merged"  # base_models.revision of a base made by merging adapters
BUSY_TIMEOUT_S = 30.0
READ_ONLY_OPENS = ("mode=ro", "mode=ro&immutable=1")  # immutable: a read-only disk without the -shm file


SERVED_QUANTIZED = "served-on-quantized-base"  # audit-log event: a quantized base serves it
QUANT_DRIFT = "quantized-base-drift"  # audit-log event: its outputs measured on a quantized base


class BaseMismatchError(LibraryError):
    """The adapter was validated against a base model with other weights."""


def check_record_base(
    record: AdapterRecord,
    digest: str,
    override: bool = False,
    quantization: BaseQuantization | None = None,
) -> None:
    """BaseMismatchError if ``record`` was validated against other base weights than ``digest``
    and ``override`` is off. ``quantization``: the base's, when it is quantized (a quantized
    version of the adapter's base serves it; ``serve_record`` says so)."""
    if record.base_status(digest, quantization) == "mismatch" and not override:
        raise BaseMismatchError(
            f"adapter {record.name!r} was validated against base {record.base_name} "
            f"(sha256 {record.base_digest[:12]}), the loaded base has sha256 {digest[:12]}; its "
            "outputs may be wrong. Override to load it anyway"
        )


def serve_record(engine: Any, record: AdapterRecord, override: bool = False, *, preload: bool) -> str | None:
    """Add a library adapter to a running engine (checked against its base), pin it if pinned;
    the library is not written. ``preload=False`` registers it without reading its weights
    (they load on first use). A quantized base of the adapter's base serves it: said in the log,
    and returned (``serving_note``); None on the adapter's own base."""
    quantization = base_quantization_of(engine.model_folder, engine.config.quantization)
    check_record_base(record, engine.base_digest, override, quantization)
    note = None
    if record.base_status(engine.base_digest, quantization) == "quantized" and quantization is not None:
        note = serving_note(
            record.name,
            record.base_name,
            record.base_digest,
            engine.model_name,
            engine.base_digest,
            quantization,
        )
        log.info("%s", note)
    if not_served_because(record, None, None) is not None:
        raise LibraryError(
            f"{record.name!r} is {record.state}, not served; `multilora-studio adapters "
            f"{'restore' if record.state == 'archived' else 'reactivate'} {record.name}` first"
        )
    engine.add_adapter(record.name, record.path, preload=preload)
    if record.pinned and hasattr(engine, "pin_adapter"):  # an engine that pins (AdapterPinning)
        engine.pin_adapter(record.name)
    return note


def model_card_scores(folder: Path, row: dict, shown_folder: Path) -> list[EvalScoreRecord]:
    """The scores of the model card (README.md) in ``folder`` of the adapter ``row`` is about
    (none without a card or a ``model-index``); a card that cannot be read is logged and left
    out: it does not stop the registration. ``shown_folder``: where the card will be."""
    card = folder / MODEL_CARD
    if not os.path.lexists(card):
        return []
    try:
        return read_model_card(card, row["name"], row["base_digest"], shown_folder / MODEL_CARD)
    except LibraryError as error:
        log.warning("%s: no scores recorded from its model card: %s", row["name"], error)
        return []


class Registry(RegistryLifecycle, RegistryRuns):
    """The adapter library (see the module docstring); safe to share between threads."""

    def __init__(self, root: Path | None = None, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.root = Path(root) if root is not None else data_dir_path()
        self.busy_timeout_s = busy_timeout_s
        self.db_path = self.root / DB_FILE
        self.adapters_dir = self.root / ADAPTERS_DIR
        self.lock_path = self.root / LOCK_FILE
        self._read_only_uri = ""  # set while it is open read-only
        try:
            self._open_for_writing()
        except OSError as error:
            self._open_read_only(storage_error(error, f"opening the adapter library in {self.root}"))
        except StorageError as error:
            self._open_read_only(error)

    @property
    def read_only(self) -> bool:
        """The library is open for reading only (its disk is read-only, full or not ours)."""
        return bool(self._read_only_uri)

    def check_writable(self) -> None:
        """StorageError if the library is open read-only and still cannot be opened for writing."""
        if not self.read_only:
            return
        uri, self._read_only_uri = self._read_only_uri, ""
        try:
            self._open_for_writing()  # the disk may have been freed or remounted since
        except (OSError, StorageError) as error:
            self._read_only_uri = uri
            cause = error.cause if isinstance(error, StorageError) else cause_of(error)
            raise StorageError(
                f"the adapter library {self.root} can only be read ({cause}); nothing was changed", cause
            ) from error

    # ---------------------------------------------------------------- reading

    def list_adapters(self) -> list[AdapterRecord]:
        """Every adapter, by name (two queries, whatever the size of the library)."""
        with self._connect() as conn:
            conn.row_factory = None  # plain tuples: RECORD_COLUMNS order, the id first
            rows = conn.execute(ADAPTER_SELECT + " ORDER BY name").fetchall()
            aliases: dict[str, list[str]] = {}
            for adapter_id, alias in conn.execute("SELECT adapter_id, alias FROM aliases ORDER BY alias"):
                aliases.setdefault(adapter_id, []).append(alias)
            warm = alias_warm_lists(conn.execute(ALIAS_WARM_QUERY + " ORDER BY w.alias, w.position"))
        return [
            AdapterRecord.from_row(row, tuple(aliases.get(row[0], ())), warm.get(row[0], ())) for row in rows
        ]

    def find(self, name: str) -> AdapterRecord | None:
        """The adapter called ``name`` (or with that alias), or None."""
        with self._connect() as conn:
            row = self._row(conn, name)
            return None if row is None else self._record(conn, row)

    def get(self, name: str) -> AdapterRecord:
        record = self.find(name)
        if record is None:
            raise LibraryError(
                f"no adapter named {name!r} in the library (see: multilora-studio adapters list)"
            )
        return record

    def find_hub(self, repo_id: str, revision: str) -> AdapterRecord | None:
        """The adapter pulled from ``repo_id`` at commit ``revision``, or None."""
        with self._connect() as conn:
            row = conn.execute(
                ADAPTER_SELECT + " WHERE source_kind = 'hub' AND source = ? AND revision = ?",
                (repo_id, revision),
            ).fetchone()
            return None if row is None else self._record(conn, row)

    def list_base_models(self) -> list[BaseModelRecord]:
        with self._connect() as conn:
            rows = conn.execute("SELECT * FROM base_models ORDER BY repo_id, created").fetchall()
            return [BaseModelRecord.from_row(row) for row in rows]

    def check_names(self, name: str, aliases: Sequence[str] = ()) -> list[str]:
        """``[name, *aliases]`` if all are valid and free; LibraryError otherwise."""
        names = [name, *aliases]
        for item in names:
            if not isinstance(item, str) or not NAME.match(item) or item in RESERVED_NAMES:
                raise NameTaken(
                    f"invalid adapter name {item!r}: use 1-128 letters, digits or ._:/@+- "
                    f"(not {', '.join(RESERVED_NAMES)})"
                )
        if len(set(names)) != len(names):
            raise LibraryError(f"the names {', '.join(names)} repeat one another")
        with self._connect() as conn:
            self._ensure_free(conn, names)
        return names

    # ---------------------------------------------------------------- adding and removing

    def import_folder(
        self,
        folder: Path,
        base: BaseModelRef,
        *,
        name: str | None = None,
        aliases: Sequence[str] = (),
        notes: str = "",
        max_rank: int = DEFAULT_MAX_RANK,
        source_file: Path | None = None,
    ) -> AdapterRecord:
        """Validate a PEFT folder against ``base`` and copy it into the library as ``name``;
        ``source_file``: the file the folder was converted from, recorded as its source."""
        source = Path(folder).expanduser().resolve()
        if not source.is_dir():
            raise LibraryError(f"{source} is not a folder")
        self._refuse_special_files(source)
        from multilora_studio.adapters.peft_adapter import weights_file  # torch: not to read the library

        read_adapter_config(source)
        weights_file(source)  # refuses pickle-only folders by name before anything is copied
        name = name or source.name
        names = self.check_names(name, aliases)
        adapter_id = uuid.uuid4().hex
        staging = self.adapters_dir / f"{STAGING_PREFIX}{adapter_id}"
        final = self.adapters_dir / adapter_id
        self.check_writable()
        try:
            with writing(self.lock_path):
                try:
                    self._copy_in(source, staging)
                    try:
                        row = self._validated_row(staging, base, name, max_rank)
                    except AdapterError as error:  # name the user's folder, not the staging copy
                        raise error.naming(str(staging), str(source_file or source)) from None
                    row.update(
                        id=adapter_id,
                        source_kind="local",
                        source=str(source_file or source),
                        path=str(final),
                        notes=notes,
                    )
                    scores = model_card_scores(staging, row, final)
                    with moving(self._write()) as (conn, moves):
                        self._insert(conn, row, names, scores)
                        moves.rename(staging, final)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)  # moved into place unless it failed
        except OSError as error:
            raise storage_error(error, f"copying {source} into the library {self.root}") from error
        log.info("imported %s as %r", source, name)
        return self.get(name)

    def register_hub(
        self,
        folder: Path,
        base: BaseModelRef,
        *,
        repo_id: str,
        revision: str,
        requested_revision: str | None,
        name: str | None = None,
        aliases: Sequence[str] = (),
        notes: str = "",
        max_rank: int = DEFAULT_MAX_RANK,
    ) -> AdapterRecord:
        """Validate a downloaded snapshot (left where it is, in the HF cache) and register it."""
        name = name or repo_id
        names = self.check_names(name, aliases)
        check_kept_files(Path(folder))
        row = self._validated_row(Path(folder), base, name, max_rank)
        row.update(
            id=uuid.uuid4().hex,
            source_kind="hub",
            source=repo_id,
            revision=revision,
            requested_revision=requested_revision,
            path=str(folder),
            notes=notes,
        )
        scores = model_card_scores(Path(folder), row, Path(folder))
        with self._write() as conn:
            self._insert(conn, row, names, scores)
        log.info("registered %s@%s as %r", repo_id, revision, name)
        return self.get(name)

    def register_base_model(
        self, repo_id: str, revision: str, requested_revision: str | None, path: Path, digest: str
    ) -> BaseModelRecord:
        """Record a base model pulled into the HF cache (once per repo and commit)."""
        with self._write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO base_models VALUES (?, ?, ?, ?, ?, ?, ?, '')",
                (uuid.uuid4().hex, repo_id, revision, requested_revision, str(path), digest, time.time()),
            )
            row = conn.execute(
                "SELECT * FROM base_models WHERE repo_id = ? AND revision = ?", (repo_id, revision)
            ).fetchone()
        return BaseModelRecord.from_row(row)

    def register_merged_base(self, name: str, path: Path, digest: str, origin: str) -> BaseModelRecord:
        """Record a base made by merging adapters (``origin``: the JSON of what it was made
        from); LibraryError if a merged base of that name exists."""
        self.check_writable()
        with self._write() as conn:
            self._refuse_taken_base_name(conn, name)
            conn.execute(
                "INSERT INTO base_models VALUES (?, ?, ?, NULL, ?, ?, ?, ?)",
                (uuid.uuid4().hex, name, MERGED_REVISION, str(path), digest, time.time(), origin),
            )
            row = conn.execute(
                "SELECT * FROM base_models WHERE repo_id = ? AND revision = ?", (name, MERGED_REVISION)
            ).fetchone()
        log.info("registered merged base model %r at %s", name, path)
        return BaseModelRecord.from_row(row)

    def check_base_name(self, name: str) -> None:
        """LibraryError if a merged base model is already named ``name``."""
        with self._connect() as conn:
            self._refuse_taken_base_name(conn, name)

    def _refuse_taken_base_name(self, conn: sqlite3.Connection, name: str) -> None:
        taken = conn.execute(
            "SELECT path FROM base_models WHERE repo_id = ? AND revision = ?", (name, MERGED_REVISION)
        ).fetchone()
        if taken is not None:
            raise NameTaken(f"a merged base model named {name!r} exists ({taken['path']})")

    def find_base_model(self, digest: str) -> BaseModelRecord | None:
        """The registered base whose weights have ``digest`` (the newest, if several), or None."""
        matches = [record for record in self.list_base_models() if digest and record.digest == digest]
        return max(matches, key=lambda record: record.created) if matches else None

    def remove(self, name: str) -> AdapterRecord:
        """Forget an adapter; an imported copy is deleted, a Hub snapshot stays in the shared HF cache."""
        record = self.get(name)
        self.check_writable()
        trash = trash_name(record.path, uuid.uuid4().hex)
        try:
            with writing(self.lock_path):
                with moving(self._write()) as (conn, moves):
                    now = self._current(conn, record.id)
                    if now is None:
                        raise LibraryError(f"{record.name!r} was removed meanwhile")
                    conn.execute("DELETE FROM adapters WHERE id = ?", (record.id,))
                    self.record_event(conn, record.id, record.name, "removed", "")
                    if self.owns_folder(now) and now.path.exists():
                        moves.rename(now.path, trash)
                shutil.rmtree(trash, ignore_errors=True)
                if now.archive_path is not None:
                    now.archive_path.unlink(missing_ok=True)
        except OSError as error:
            raise storage_error(error, f"removing {record.name!r} from the library {self.root}") from error
        log.info("removed %r", record.name)
        return record

    # ---------------------------------------------------------------- small updates

    def set_pinned(self, name: str, pinned: bool = True) -> AdapterRecord:
        """Pinned adapters keep their GPU slot once loaded."""
        return self._update(name, "pinned = ?", int(pinned))

    def set_notes(self, name: str, notes: str) -> AdapterRecord:
        return self._update(name, "notes = ?", notes)

    def touch(self, name: str) -> AdapterRecord:
        """Record that the adapter was used now."""
        return self._update(name, "last_used = ?", time.time())

    def rename(self, name: str, new_name: str) -> AdapterRecord:
        """Give ``name`` a new name (its aliases, files and history stay)."""
        (checked,) = self.check_names(new_name, ())
        with self._write() as conn:
            row = self._row(conn, name)
            if row is None:
                raise LibraryError(f"no adapter named {name!r} in the library")
            if checked != row["name"]:
                self._ensure_free(conn, [checked])
                conn.execute("UPDATE adapters SET name = ? WHERE id = ?", (checked, row["id"]))
        return self.get(checked)

    def add_alias(self, name: str, alias: str) -> AdapterRecord:
        (checked,) = self.check_names(alias, ())
        with self._write() as conn:
            row = self._row(conn, name)
            if row is None:
                raise LibraryError(f"no adapter named {name!r} in the library")
            self._ensure_free(conn, [checked])
            conn.execute("INSERT INTO aliases VALUES (?, ?)", (checked, row["id"]))
        return self.get(name)

    def remove_alias(self, alias: str) -> None:
        with self._write() as conn:
            if conn.execute("DELETE FROM aliases WHERE alias = ?", (alias,)).rowcount != 1:
                raise LibraryError(f"no alias {alias!r} in the library")

    # ---------------------------------------------------------------- evaluation scores

    def record_eval_scores(self, scores: Sequence[EvalScoreRecord]) -> None:
        """Record each adapter's scores of one evaluation, all in one transaction (or none)."""
        with self._write() as conn:
            for score in scores:
                row = self._row(conn, score.adapter)
                if row is None:
                    raise LibraryError(
                        f"no adapter named {score.adapter!r} in the library; no scores recorded"
                    )
                insert_score(conn, row["id"], score)

    def eval_scores(self, name: str) -> list[EvalScoreRecord]:
        """The adapter's recorded evaluation scores, newest first."""
        record = self.get(name)
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT * FROM eval_scores WHERE adapter_id = ? ORDER BY created DESC, id DESC", (record.id,)
            ).fetchall()
        return [EvalScoreRecord.from_row(row, record.name) for row in rows]

    def served_records(self, min_pass_rate: float | None = None) -> list[AdapterRecord]:
        """The adapters the library serves (``not_served_because``, the quality gate at
        ``min_pass_rate``): each left out is logged with why, and each the gate lets through
        without judging it (``unjudged_because``) with a warning."""
        latest, newest = self.latest_eval_scores(counted=True), self.latest_eval_scores()
        served = []
        for record in self.list_adapters():
            refused = not_served_because(record, latest.get(record.name), min_pass_rate)
            if refused is not None:
                log.info("library adapter %s not served: %s", record.name, refused)
                continue
            unjudged = unjudged_because(latest.get(record.name), newest.get(record.name), min_pass_rate)
            if unjudged is not None:
                log.warning("library adapter %s served without the quality gate: %s", record.name, unjudged)
            served.append(record)
        return served

    def latest_eval_scores(self, counted: bool = False) -> dict[str, EvalScoreRecord]:
        """Each evaluated adapter's newest scores, by adapter name; ``counted``: of the scores
        with counts only (what the quality gate judges; a model card's metrics have none)."""
        where = " WHERE eval_scores.checked IS NOT NULL" if counted else ""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT eval_scores.*, adapters.name AS adapter_name FROM eval_scores JOIN adapters "
                f"ON adapters.id = eval_scores.adapter_id{where} ORDER BY created, eval_scores.id"
            ).fetchall()
        return {row["adapter_name"]: EvalScoreRecord.from_row(row, row["adapter_name"]) for row in rows}

    # ---------------------------------------------------------------- the loaded base model

    def check_base(self, name: str, digest: str, override: bool = False) -> AdapterRecord:
        """The record, unless it was validated against other base weights and ``override`` is off."""
        record = self.get(name)
        check_record_base(record, digest, override)
        return record

    def load_into(
        self, engine: Any, name: str, override: bool = False, preload: bool = True
    ) -> AdapterRecord:
        """Serve a library adapter on a running engine (``serve_record``) and record it as used now."""
        record = self.get(name)
        note = serve_record(engine, record, override, preload=preload)
        if note is not None:
            self.record_serving_note(record, note)
        return self.touch(record.name)

    def note_serving(
        self, record: AdapterRecord, base_name: str, digest: str, quantization: BaseQuantization
    ) -> str:
        """Record in the audit log, once per base, which base serves the adapter: a quantized version
        of the one it was trained on. Returns what it says (``serving_note``)."""
        note = serving_note(
            record.name, record.base_name, record.base_digest, base_name, digest, quantization
        )
        self.record_serving_note(record, note)
        return note

    def record_serving_note(self, record: AdapterRecord, note: str) -> None:
        """Write ``note`` (``serving_note``) to the adapter's audit log unless it is there."""
        if not any(e.event == SERVED_QUANTIZED and e.reason == note for e in self.events(record.name)):
            with self._write() as conn:
                self.record_event(conn, record.id, record.name, SERVED_QUANTIZED, note)

    def record_quant_drift(self, name: str, measured: str) -> None:
        """Record in the audit log how far the adapter's outputs move on a quantized base
        (``evaluate/quant_drift.py``: which base, the mean KL and top-1 agreement)."""
        record = self.get(name)
        with self._write() as conn:
            self.record_event(conn, record.id, record.name, QUANT_DRIFT, measured)

    # ---------------------------------------------------------------- internals

    def _open_for_writing(self) -> None:
        refused = unwritable(self.root)
        if refused is not None:
            raise refused
        self.root.parent.mkdir(parents=True, exist_ok=True)
        make_private_dir(self.root)
        tighten_tree(self.adapters_dir)  # before make_private_dir, which would tighten it alone
        make_private_dir(self.adapters_dir)
        create_private_file(self.db_path)  # before SQLite creates it with the umask's mode
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode = WAL")
        with self._write() as conn:
            migrate(conn)
        for entry in self.root.iterdir():  # the database, its -wal and -shm, the lock, markers
            if not entry.is_dir():
                tighten(entry)
        sweep(self.adapters_dir, self.archives_dir, self.lock_path, self._named_by_rows)

    def _open_read_only(self, error: StorageError) -> None:
        """Open the existing library for reading only, or raise ``error`` if that fails too."""
        if not self.db_path.is_file():
            raise error
        for query in READ_ONLY_OPENS:
            self._read_only_uri = f"{self.db_path.absolute().as_uri()}?{query}"
            try:
                with self._connect() as conn:
                    conn.execute("SELECT count(*) FROM adapters").fetchone()
            except (LibraryError, sqlite3.Error):
                continue
            log.warning("the adapter library %s can only be read: %s", self.root, error.cause)
            return
        raise error

    @staticmethod
    def _copy_in(source: Path, staging: Path) -> None:
        """Copy the adapter's files of ``source`` into the new folder ``staging``."""
        make_private_dir(staging)
        for file in kept_files_in(source):
            copy_regular_file(source / file, staging / file, KEPT_FILES[file])

    def _refuse_special_files(self, source: Path) -> None:
        """LibraryError naming the first kept file that is a link, a pipe or a device."""
        for file in kept_files_in(source):
            why = refusal(source / file)
            if why is not None:
                raise LibraryError(f"{why}; nothing was imported")

    def _named_by_rows(self) -> NamedByRows:
        with self._connect() as conn:
            rows = conn.execute("SELECT id, state, archive_path FROM adapters").fetchall()
        return NamedByRows(
            live=frozenset(row[0] for row in rows if row[1] != ARCHIVED),
            archives=frozenset(Path(row[2]).name for row in rows if row[2]),
        )

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = None
        try:
            conn = self._new_connection()
            yield conn
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise storage_error(error, f"using the adapter library {self.db_path}") from error
            raise LibraryError(
                f"the adapter library {self.db_path} stayed locked by another writer for "
                f"{self.busy_timeout_s:g} s; try again"
            ) from error
        finally:
            if conn is not None:
                conn.close()

    def _new_connection(self) -> sqlite3.Connection:
        if self._read_only_uri:
            conn = sqlite3.connect(self._read_only_uri, self.busy_timeout_s, isolation_level=None, uri=True)
        else:
            conn = sqlite3.connect(self.db_path, self.busy_timeout_s, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed when the block ends, rolled back if it raises."""
        self.check_writable()
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _row(self, conn: sqlite3.Connection, name: str) -> sqlite3.Row | None:
        return conn.execute(
            ADAPTER_SELECT + " WHERE name = ? OR id = (SELECT adapter_id FROM aliases WHERE alias = ?)",
            (name, name),
        ).fetchone()

    def _record(self, conn: sqlite3.Connection, row: sqlite3.Row) -> AdapterRecord:
        aliases = conn.execute(
            "SELECT alias FROM aliases WHERE adapter_id = ? ORDER BY alias", (row["id"],)
        ).fetchall()
        query = ALIAS_WARM_QUERY + " WHERE s.adapter_id = ? ORDER BY w.alias, w.position"
        warm = alias_warm_lists(conn.execute(query, (row["id"],)))
        return AdapterRecord.from_row(row, tuple(a[0] for a in aliases), warm.get(row["id"], ()))

    def _update(self, name: str, assignment: str, value: object) -> AdapterRecord:
        with self._write() as conn:
            row = self._row(conn, name)
            if row is None:
                raise LibraryError(f"no adapter named {name!r} in the library")
            conn.execute(f"UPDATE adapters SET {assignment} WHERE id = ?", (value, row["id"]))
        return self.get(name)

    def _ensure_free(self, conn: sqlite3.Connection, names: Sequence[str]) -> None:
        for item in names:
            taken = conn.execute(
                "SELECT 1 FROM adapters WHERE name = ? UNION SELECT 1 FROM aliases WHERE alias = ?",
                (item, item),
            ).fetchone()
            if taken:
                raise NameTaken(f"the library already has an adapter or alias named {item!r}")

    def _validated_row(self, folder: Path, base: BaseModelRef, name: str, max_rank: int) -> dict:
        from multilora_studio.adapters.peft_adapter import load_peft_adapter  # torch: not to read the library

        host = load_peft_adapter(name, folder, base.num_layers, base.shape_of, max_rank, base.vocab)
        return dict(
            name=name,
            revision=None,
            requested_revision=None,
            declared_base=host.base_model,
            base_name=base.name,
            base_digest=base.digest,
            rank=host.rank,
            alpha=host.alpha,
            targets=",".join(host.targets),
            kind=host.kind,
            tokens=host.tokens.label if host.tokens is not None else "",
            tokenizer=tokenizer_files_label(folder),
            size_bytes=(folder / WEIGHTS_FILE).stat().st_size,
            created=time.time(),
            last_used=None,
            pinned=0,
        )

    def _insert(
        self, conn: sqlite3.Connection, row: dict, names: Sequence[str], scores: Sequence[EvalScoreRecord]
    ) -> None:
        """Register ``row`` under ``names`` (its name, then its aliases) with its model card's ``scores``."""
        self._ensure_free(conn, names)
        columns = ", ".join(row)
        conn.execute(
            f"INSERT INTO adapters ({columns}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
        )
        conn.executemany("INSERT INTO aliases VALUES (?, ?)", [(alias, row["id"]) for alias in names[1:]])
        self.record_event(
            conn, row["id"], row["name"], "registered", f"{row['source_kind']}: {row['source']}"
        )
        for score in scores:
            insert_score(conn, row["id"], score)
