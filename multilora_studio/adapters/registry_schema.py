"""The adapter library's SQLite schema, its migrations and the records read from it."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from multilora_studio.adapters.base_quantization import BaseQuantization
from multilora_studio.sqlite_schema import migrate as migrate_steps

SCHEMA_VERSION = 10
# Migration n brings a database from user_version n-1 to n.
MIGRATIONS = {
    1: """
    CREATE TABLE adapters (
        id TEXT PRIMARY KEY,                -- folder name under adapters/ for imports
        name TEXT NOT NULL UNIQUE,
        source_kind TEXT NOT NULL CHECK (source_kind IN ('local', 'hub')),
        source TEXT NOT NULL,               -- the imported folder, or the Hub repo id
        revision TEXT,                      -- Hub commit sha the files are pinned to
        requested_revision TEXT,            -- what was asked for: a tag, branch or sha
        path TEXT NOT NULL,                 -- where the files are now
        declared_base TEXT,                 -- base_model_name_or_path in adapter_config.json
        base_name TEXT NOT NULL,            -- the base model it was validated against
        base_digest TEXT NOT NULL,          -- SHA-256 of that base's weights ('' = unknown)
        rank INTEGER NOT NULL,
        alpha REAL NOT NULL,
        targets TEXT NOT NULL,              -- comma-separated module names
        size_bytes INTEGER NOT NULL,
        created REAL NOT NULL,              -- unix time
        last_used REAL,
        pinned INTEGER NOT NULL DEFAULT 0,
        notes TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX adapters_source ON adapters (source_kind, source, revision);
    CREATE TABLE aliases (
        alias TEXT PRIMARY KEY,
        adapter_id TEXT NOT NULL REFERENCES adapters (id) ON DELETE CASCADE
    );
    CREATE TABLE base_models (
        id TEXT PRIMARY KEY,
        repo_id TEXT NOT NULL,
        revision TEXT NOT NULL,
        requested_revision TEXT,
        path TEXT NOT NULL,
        digest TEXT NOT NULL,
        created REAL NOT NULL,
        UNIQUE (repo_id, revision)
    );
    """,
    2: """
    CREATE TABLE eval_scores (
        id INTEGER PRIMARY KEY,
        adapter_id TEXT NOT NULL REFERENCES adapters (id) ON DELETE CASCADE,
        prompt_set TEXT NOT NULL,           -- the prompt set's name (its file name without suffix)
        prompt_set_digest TEXT NOT NULL,    -- SHA-256 of the prompt set file
        base_digest TEXT NOT NULL,          -- SHA-256 of the base weights it ran on ('' = unknown)
        prompts INTEGER NOT NULL,
        checked INTEGER NOT NULL,           -- prompts with a check
        passed INTEGER NOT NULL,
        reference_logprob REAL,             -- mean log-probability per reference token
        results_path TEXT,                  -- the saved results file
        created REAL NOT NULL               -- unix time
    );
    CREATE INDEX eval_scores_adapter ON eval_scores (adapter_id, created);
    """,
    # kind: AdapterConfig.kind ("DoRA", "LoRA", "aLoRA", either "with bias")
    3: """
    ALTER TABLE adapters ADD COLUMN kind TEXT NOT NULL DEFAULT 'LoRA'
    """,
    # tokens: the vocabulary rows it replaces (TokenTables.label: "lm_head", "+8 tokens", ...);
    # tokenizer: its own tokenizer / template files (tokenizer_files_label)
    4: """
    ALTER TABLE adapters ADD COLUMN tokens TEXT NOT NULL DEFAULT '';
    ALTER TABLE adapters ADD COLUMN tokenizer TEXT NOT NULL DEFAULT ''
    """,
    # origin: for a base made by merging adapters, the JSON of what it was made from
    # (MergedBaseOrigin); '' for a base pulled from the Hub
    5: """
    ALTER TABLE base_models ADD COLUMN origin TEXT NOT NULL DEFAULT ''
    """,
    # the lifecycle (registry_lifecycle.py): state, an archive's file and digest, the audit log
    # (kept when an adapter is removed, so no foreign key)
    6: """
    ALTER TABLE adapters ADD COLUMN state TEXT NOT NULL DEFAULT 'active'
        CHECK (state IN ('active', 'retired', 'archived'));
    ALTER TABLE adapters ADD COLUMN archive_path TEXT;
    ALTER TABLE adapters ADD COLUMN archive_sha256 TEXT;
    ALTER TABLE adapters ADD COLUMN warm INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE adapter_events (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        adapter_id TEXT NOT NULL,
        name TEXT NOT NULL,
        event TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX adapter_events_adapter ON adapter_events (adapter_id, id)
    """,
    # lookups that stay quick in a library of thousands: an adapter's aliases, an adapter's
    # history by any name it had
    7: """
    CREATE INDEX aliases_adapter ON aliases (adapter_id, alias);
    CREATE INDEX adapter_events_name ON adapter_events (name)
    """,
    # per alias, the adapters read into host RAM when a request first uses the alias
    8: """
    CREATE TABLE alias_warm (
        alias TEXT NOT NULL REFERENCES aliases (alias) ON DELETE CASCADE,
        adapter_id TEXT NOT NULL REFERENCES adapters (id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        PRIMARY KEY (alias, adapter_id)
    )
    """,
    # scores without counts (a model card's metrics): the counts may be NULL, the metric and its
    # value are kept (SQLite cannot drop NOT NULL in place: the table is copied)
    9: """
    CREATE TABLE eval_scores_9 (
        id INTEGER PRIMARY KEY,
        adapter_id TEXT NOT NULL REFERENCES adapters (id) ON DELETE CASCADE,
        prompt_set TEXT NOT NULL,
        prompt_set_digest TEXT NOT NULL,
        base_digest TEXT NOT NULL,
        prompts INTEGER,
        checked INTEGER,
        passed INTEGER,
        reference_logprob REAL,
        results_path TEXT,
        created REAL NOT NULL,
        metric TEXT,
        value REAL
    );
    INSERT INTO eval_scores_9 (id, adapter_id, prompt_set, prompt_set_digest, base_digest, prompts,
        checked, passed, reference_logprob, results_path, created)
        SELECT id, adapter_id, prompt_set, prompt_set_digest, base_digest, prompts, checked, passed,
        reference_logprob, results_path, created FROM eval_scores;
    DROP TABLE eval_scores;
    ALTER TABLE eval_scores_9 RENAME TO eval_scores;
    CREATE INDEX eval_scores_adapter ON eval_scores (adapter_id, created)
    """,
    # training runs followed as they write checkpoints (registry_runs.py): each checkpoint found,
    # the adapter it was imported as, its losses and its per-prompt scores on the run's prompt set
    10: """
    CREATE TABLE runs (
        name TEXT PRIMARY KEY,
        folder TEXT NOT NULL UNIQUE,        -- the training output folder, resolved
        prompt_set TEXT NOT NULL DEFAULT '',  -- the prompt set file each checkpoint is scored on
        created REAL NOT NULL,
        watching INTEGER NOT NULL DEFAULT 1,
        losses TEXT NOT NULL DEFAULT '[]',  -- JSON [[step, loss, eval_loss], ...] of log_history
        best TEXT                           -- the adapter RUN@best names
    );
    CREATE TABLE run_checkpoints (
        id INTEGER PRIMARY KEY,
        run TEXT NOT NULL REFERENCES runs (name) ON DELETE CASCADE,
        step INTEGER NOT NULL,
        version INTEGER NOT NULL,           -- 1, then 2... for another file set of the same step
        adapter TEXT NOT NULL,              -- the name it was imported as
        adapter_id TEXT REFERENCES adapters (id) ON DELETE SET NULL,
        folder TEXT NOT NULL,               -- where it was found
        files TEXT NOT NULL,                -- JSON of its files' names, sizes and times then
        weights_sha256 TEXT NOT NULL,
        train_loss REAL,
        eval_loss REAL,
        metric TEXT,                        -- what its scores measure (NULL until scored)
        scores TEXT,                        -- JSON per-prompt scores (null: a prompt not scored)
        scored_with TEXT,                   -- the prompt set's digest and the settings they came from
        gone INTEGER NOT NULL DEFAULT 0,    -- its folder was deleted (a trainer's rotation)
        created REAL NOT NULL,
        UNIQUE (run, step, version)
    );
    CREATE INDEX run_checkpoints_run ON run_checkpoints (run, step, version)
    """,
}


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema to ``SCHEMA_VERSION`` (the caller holds a write transaction)."""
    migrate_steps(
        conn,
        MIGRATIONS,
        "the adapter library was written by a newer MultiLoRA Studio (schema {version}); upgrade",
    )


def insert_score(conn: sqlite3.Connection, adapter_id: str, score: EvalScoreRecord) -> None:
    """One score row, inside the caller's transaction."""
    conn.execute(
        "INSERT INTO eval_scores (adapter_id, prompt_set, prompt_set_digest, base_digest, prompts, checked, "
        "passed, reference_logprob, results_path, created, metric, value) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            adapter_id, score.prompt_set, score.prompt_set_digest, score.base_digest, score.prompts,
            score.checked, score.passed, score.reference_logprob, score.results_path, score.created,
            score.metric, score.value,
        ),
    )  # fmt: skip


@functools.lru_cache(maxsize=256)
def targets_of(column: str) -> tuple[str, ...]:
    """The target modules of an ``adapters.targets`` value (comma-separated); a library's
    adapters share a few of these."""
    return tuple(t for t in column.split(",") if t)


@dataclass(frozen=True)
class AdapterRecord:
    """One adapter of the library."""

    id: str
    name: str
    aliases: tuple[str, ...]
    source_kind: str
    source: str
    revision: str | None
    requested_revision: str | None
    folder: str  # where the files are now, as the library stores it (``path``: as a Path)
    declared_base: str | None
    base_name: str
    base_digest: str
    rank: int
    alpha: float
    targets: tuple[str, ...]
    size_bytes: int
    created: float
    last_used: float | None
    pinned: bool
    notes: str
    kind: str = "LoRA"  # AdapterConfig.kind: "DoRA", "LoRA", "aLoRA", either "with bias"
    tokens: str = ""  # the vocabulary rows it replaces ("lm_head", "embed_tokens, lm_head, +8 tokens")
    tokenizer: str = ""  # "own tokenizer / template", "own tokenizer", "own template" or ""
    state: str = "active"  # "active" (served), "retired" (listed, not served), "archived" (packed)
    archive_path: Path | None = None
    archive_sha256: str | None = None
    warm: bool = False  # read into host RAM when an engine starts (before its first request)
    # (alias, adapters) for its aliases with a warm list: read into host RAM on the alias's first use
    alias_warm: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_row(
        cls,
        row: Sequence[Any],
        aliases: tuple[str, ...],
        alias_warm: tuple[tuple[str, tuple[str, ...]], ...] = (),
    ) -> AdapterRecord:
        """The record of a row of ``ADAPTER_SELECT`` (its values in ``RECORD_COLUMNS`` order)."""
        values = dict(zip(RECORD_COLUMNS, row, strict=False))  # the select's: one value a field
        values["aliases"], values["alias_warm"] = aliases, alias_warm
        values["targets"] = targets_of(values["targets"])
        values["pinned"], values["warm"] = bool(values["pinned"]), bool(values["warm"])
        values["archive_path"] = Path(values["archive_path"]) if values["archive_path"] else None
        record = object.__new__(cls)
        # all fields at once: the frozen __init__ sets each through object.__setattr__, which
        # took as long as the query itself for 10,000 records
        object.__setattr__(record, "__dict__", values)
        return record

    @property
    def path(self) -> Path:
        """Where the files are now (made when asked: a Path for each of 10,000 records took a
        third of listing them)."""
        return Path(self.folder)

    @property
    def contents_label(self) -> str:
        """The kind with what else it brings: "LoRA", "DoRA; lm_head; own template"."""
        return "; ".join(part for part in (self.kind, self.tokens, self.tokenizer) if part)

    def base_status(self, digest: str, quantization: BaseQuantization | None = None) -> str:
        """'ok', 'mismatch' (trained on another base), 'unknown' (a digest is missing) or
        'quantized' (the base of ``digest`` is quantized, ``quantization``: a quantized checkpoint
        other than the one it was validated on, or these weights quantized at load; served, and
        said so: ``adapters/base_quantization.py``)."""
        if not digest or not self.base_digest:
            return "unknown"
        same = digest == self.base_digest
        if quantization is not None and (quantization.at_load or not same):
            return "quantized"
        return "ok" if same else "mismatch"

    @property
    def rank_label(self) -> str:
        """The rank, with the contents when not plain LoRA: "16", "16 (DoRA)", "8 (LoRA; lm_head)"."""
        contents = self.contents_label
        return str(self.rank) if contents == "LoRA" else f"{self.rank} ({contents})"

    @property
    def source_label(self) -> str:
        if self.source_kind == "hub":
            return f"{self.source}@{self.revision}"
        return self.source


# AdapterRecord's fields read from the adapters table, in field order (its aliases come from
# their tables), and the query that reads them (``folder`` is the column ``path``)
RECORD_COLUMNS = tuple(f.name for f in fields(AdapterRecord) if f.name not in ("aliases", "alias_warm"))
ADAPTER_SELECT = (
    f"SELECT {', '.join('path AS folder' if c == 'folder' else c for c in RECORD_COLUMNS)} FROM adapters"
)


@dataclass(frozen=True)
class EvalScoreRecord:
    """One adapter's scores on one prompt set, as an evaluation recorded them; or one metric of
    a model card's ``model-index`` (``metric`` and ``value``, with no counts: None)."""

    adapter: str
    prompt_set: str
    prompt_set_digest: str
    base_digest: str
    prompts: int | None
    checked: int | None
    passed: int | None
    reference_logprob: float | None
    results_path: str | None
    created: float
    metric: str | None = None  # a model card's metric type ("acc", "f1", ...)
    value: float | None = None  # its value, as the card gives it

    @property
    def pass_rate(self) -> float | None:
        """Passed / checked; None without counts or checked prompts."""
        return self.passed / self.checked if self.checked and self.passed is not None else None

    @property
    def label(self) -> str:
        """``set: 3/4 passed, -1.23/token``, or ``set: acc 31.46 (no counts)``."""
        if self.checked is None:
            value = "-" if self.value is None else f"{self.value:g}"
            return f"{self.prompt_set}: {self.metric} {value} (no counts)"
        logprob = "" if self.reference_logprob is None else f", {self.reference_logprob:.2f}/token"
        return f"{self.prompt_set}: {self.passed}/{self.checked} passed{logprob}"

    @classmethod
    def from_row(cls, row: sqlite3.Row, adapter: str) -> EvalScoreRecord:
        return cls(
            adapter=adapter,
            prompt_set=row["prompt_set"],
            prompt_set_digest=row["prompt_set_digest"],
            base_digest=row["base_digest"],
            prompts=row["prompts"],
            checked=row["checked"],
            passed=row["passed"],
            reference_logprob=row["reference_logprob"],
            results_path=row["results_path"],
            created=row["created"],
            metric=row["metric"],
            value=row["value"],
        )


@dataclass(frozen=True)
class BaseModelRecord:
    """A base model pulled from the Hub into the HF cache, or made by merging adapters (then
    ``revision`` is "merged" and ``origin`` the JSON of what it was made from)."""

    id: str
    repo_id: str
    revision: str
    requested_revision: str | None
    path: Path
    digest: str
    created: float
    origin: str = ""

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> BaseModelRecord:
        return cls(
            id=row["id"],
            repo_id=row["repo_id"],
            revision=row["revision"],
            requested_revision=row["requested_revision"],
            path=Path(row["path"]),
            digest=row["digest"],
            created=row["created"],
            origin=row["origin"],
        )
