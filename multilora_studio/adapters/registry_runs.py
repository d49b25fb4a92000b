"""Training runs in the library: each run's folder and prompt set, every checkpoint found in it
with the adapter it was imported as, its losses and per-prompt scores, and the aliases that move
with the run (``RUN@latest``, ``RUN@best``). What a watcher needs to resume after a restart is
all here."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.library_errors import LibraryError, NameTaken
from multilora_studio.adapters.registry_schema import AdapterRecord, EvalScoreRecord, insert_score
from multilora_studio.adapters.run_folder import LossPoint, Signature

LATEST, BEST = "latest", "best"


def checkpoint_name(run: str, step: int, version: int = 1) -> str:
    """``RUN@step-N``, ``RUN@step-N.v2`` for a second file set of the same step."""
    return f"{run}@step-{step}" + ("" if version == 1 else f".v{version}")


def run_alias(run: str, which: str) -> str:
    """``RUN@latest`` or ``RUN@best``."""
    return f"{run}@{which}"


@dataclass(frozen=True)
class RunRecord:
    """One training run the library follows."""

    name: str
    folder: Path
    prompt_set: str  # the prompt set file ('' = none: checkpoints are not scored)
    created: float
    watching: bool
    losses: tuple[LossPoint, ...]
    best: str | None  # the adapter RUN@best names


@dataclass(frozen=True)
class CheckpointRecord:
    """One checkpoint of a run, imported as ``adapter``; ``scores`` are per prompt (None: a prompt
    the metric does not score), None until it is evaluated."""

    id: int
    run: str
    step: int
    version: int
    adapter: str
    present: bool  # the adapter is still in the library
    folder: Path
    signature: Signature
    weights_sha256: str
    train_loss: float | None
    eval_loss: float | None
    metric: str | None
    scores: tuple[float | None, ...] | None
    scored_with: str | None  # the prompt set's digest and the evaluation settings of ``scores``
    gone: bool
    created: float

    @property
    def mean_score(self) -> float | None:
        values = [value for value in self.scores or () if value is not None]
        return sum(values) / len(values) if values else None


def run_of(row: sqlite3.Row) -> RunRecord:
    return RunRecord(
        name=row["name"],
        folder=Path(row["folder"]),
        prompt_set=row["prompt_set"],
        created=row["created"],
        watching=bool(row["watching"]),
        losses=tuple(LossPoint(step, loss, eval_loss) for step, loss, eval_loss in json.loads(row["losses"])),
        best=row["best"],
    )


def checkpoint_of(row: sqlite3.Row) -> CheckpointRecord:
    scores = None if row["scores"] is None else tuple(json.loads(row["scores"]))
    return CheckpointRecord(
        id=row["id"],
        run=row["run"],
        step=row["step"],
        version=row["version"],
        adapter=row["adapter"],
        present=row["adapter_id"] is not None,
        folder=Path(row["folder"]),
        signature=tuple((name, size, mtime) for name, size, mtime in json.loads(row["files"])),
        weights_sha256=row["weights_sha256"],
        train_loss=row["train_loss"],
        eval_loss=row["eval_loss"],
        metric=row["metric"],
        scores=scores,
        scored_with=row["scored_with"],
        gone=bool(row["gone"]),
        created=row["created"],
    )


class RegistryRuns:
    """The training-run half of ``Registry`` (its connections and records)."""

    def get(self, name: str) -> AdapterRecord:  # pragma: no cover - Registry's
        raise NotImplementedError

    def _write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:  # pragma: no cover
        raise NotImplementedError

    def _connect(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:  # pragma: no cover
        raise NotImplementedError

    def _row(self, conn: sqlite3.Connection, name: str) -> sqlite3.Row | None:  # pragma: no cover
        raise NotImplementedError

    # ---------------------------------------------------------------- runs

    def follow_run(self, name: str, folder: Path, prompt_set: str = "") -> RunRecord:
        """Record the run ``name`` of ``folder`` (resolved), or resume it: the same name and folder
        return the run as it was, watched again (a new ``prompt_set`` replaces the old one).
        LibraryError when the name or the folder belongs to another run."""
        folder = Path(folder).expanduser().resolve()
        with self._write() as conn:
            row = self._run_row(conn, name, folder)
            if row is None:
                conn.execute(
                    "INSERT INTO runs (name, folder, prompt_set, created) VALUES (?, ?, ?, ?)",
                    (name, str(folder), prompt_set, time.time()),
                )
            else:
                conn.execute(
                    "UPDATE runs SET watching = 1, prompt_set = ? WHERE name = ?",
                    (prompt_set or row["prompt_set"], name),
                )
        return self.run(name)

    def check_run(self, name: str, folder: Path) -> None:
        """NameTaken when ``name`` or ``folder`` belongs to another run (what ``follow_run`` refuses)."""
        with self._connect() as conn:
            self._run_row(conn, name, Path(folder).expanduser().resolve())

    @staticmethod
    def _run_row(conn: sqlite3.Connection, name: str, folder: Path) -> sqlite3.Row | None:
        """The run ``name`` of ``folder``, None for none; NameTaken when either is another run's."""
        row = conn.execute("SELECT * FROM runs WHERE name = ? OR folder = ?", (name, str(folder))).fetchone()
        if row is not None and (row["name"] != name or row["folder"] != str(folder)):
            raise NameTaken(
                f"the run {row['name']!r} already follows {row['folder']}; "
                f"name the run {row['name']!r} to resume it, or pick another name and folder"
            )
        return row

    def runs(self) -> list[RunRecord]:
        with self._connect() as conn:
            return [run_of(row) for row in conn.execute("SELECT * FROM runs ORDER BY created, name")]

    def run(self, name: str) -> RunRecord:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM runs WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise LibraryError(f"no training run named {name!r} in the library")
        return run_of(row)

    def stop_watching(self, name: str) -> None:
        """The run is no longer followed (its checkpoints stay)."""
        with self._write() as conn:
            conn.execute("UPDATE runs SET watching = 0 WHERE name = ?", (name,))

    def set_run_losses(self, name: str, points: Sequence[LossPoint]) -> None:
        """Merge ``points`` into the run's loss curve (a point of a step replaces the one it had)."""
        with self._write() as conn:
            row = conn.execute("SELECT losses FROM runs WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise LibraryError(f"no training run named {name!r} in the library")
            merged = {step: [step, loss, eval_loss] for step, loss, eval_loss in json.loads(row["losses"])}
            merged.update({p.step: [p.step, p.loss, p.eval_loss] for p in points})
            curve = json.dumps([merged[step] for step in sorted(merged)])
            conn.execute("UPDATE runs SET losses = ? WHERE name = ?", (curve, name))

    # ---------------------------------------------------------------- checkpoints

    def checkpoints(self, run: str) -> list[CheckpointRecord]:
        """The run's checkpoints by step and version."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT * FROM run_checkpoints WHERE run = ? ORDER BY step, version", (run,)
            ).fetchall()
        return [checkpoint_of(row) for row in rows]

    def add_checkpoint(
        self,
        run: str,
        step: int,
        adapter: str,
        folder: Path,
        signature: Signature,
        weights_sha256: str,
        loss: LossPoint | None,
    ) -> CheckpointRecord:
        """Record the checkpoint imported as ``adapter`` as the next version of ``step``."""
        with self._write() as conn:
            found = self._row(conn, adapter)
            if found is None:
                raise LibraryError(f"no adapter named {adapter!r} in the library")
            version = conn.execute(
                "SELECT coalesce(max(version), 0) + 1 FROM run_checkpoints WHERE run = ? AND step = ?",
                (run, step),
            ).fetchone()[0]
            cursor = conn.execute(
                "INSERT INTO run_checkpoints (run, step, version, adapter, adapter_id, folder, files, "
                "weights_sha256, train_loss, eval_loss, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run, step, version, adapter, found["id"], str(folder), json.dumps(signature),
                    weights_sha256, None if loss is None else loss.loss,
                    None if loss is None else loss.eval_loss, time.time(),
                ),
            )  # fmt: skip
            row = conn.execute("SELECT * FROM run_checkpoints WHERE id = ?", (cursor.lastrowid,)).fetchone()
        return checkpoint_of(row)

    def next_checkpoint_version(self, run: str, step: int) -> int:
        with self._connect() as conn:
            return int(
                conn.execute(
                    "SELECT coalesce(max(version), 0) + 1 FROM run_checkpoints WHERE run = ? AND step = ?",
                    (run, step),
                ).fetchone()[0]
            )

    def checkpoint_seen(self, checkpoint_id: int, folder: Path, signature: Signature) -> None:
        """The checkpoint's files were seen again (a restarted run rewrote the same weights)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE run_checkpoints SET folder = ?, files = ?, gone = 0 WHERE id = ?",
                (str(folder), json.dumps(signature), checkpoint_id),
            )

    def checkpoint_gone(self, checkpoint_id: int) -> None:
        """The checkpoint's folder was deleted (the library keeps its copy)."""
        with self._write() as conn:
            conn.execute("UPDATE run_checkpoints SET gone = 1 WHERE id = ?", (checkpoint_id,))

    def record_checkpoint_scores(
        self,
        checkpoint_id: int,
        metric: str,
        scores: Sequence[float | None],
        summary: EvalScoreRecord,
        scored_with: str,
    ) -> None:
        """The checkpoint's per-prompt ``scores`` (made with ``scored_with``: the prompt set's
        digest and the settings) and its evaluation's ``summary`` (into the adapter's eval
        scores), in one transaction; they replace the checkpoint's earlier scores."""
        with self._write() as conn:
            row = conn.execute(
                "SELECT adapter_id FROM run_checkpoints WHERE id = ?", (checkpoint_id,)
            ).fetchone()
            if row is None or row["adapter_id"] is None:
                raise LibraryError(f"the checkpoint {summary.adapter!r} is no longer in the library")
            conn.execute(
                "UPDATE run_checkpoints SET metric = ?, scores = ?, scored_with = ? WHERE id = ?",
                (metric, json.dumps(list(scores)), scored_with, checkpoint_id),
            )
            insert_score(conn, row["adapter_id"], summary)

    # ---------------------------------------------------------------- moving aliases

    def point_alias(self, alias: str, name: str) -> AdapterRecord:
        """Make ``alias`` name the adapter ``name`` (moved from the one it named, or new), in one
        transaction; NameTaken when an adapter is called ``alias``."""
        with self._write() as conn:
            row = self._row(conn, name)
            if row is None:
                raise LibraryError(f"no adapter named {name!r} in the library")
            if conn.execute("SELECT 1 FROM adapters WHERE name = ?", (alias,)).fetchone():
                raise NameTaken(f"the library has an adapter named {alias!r}; it cannot be an alias")
            conn.execute("DELETE FROM aliases WHERE alias = ?", (alias,))
            conn.execute("INSERT INTO aliases VALUES (?, ?)", (alias, row["id"]))
        return self.get(name)

    def set_run_best(self, run: str, adapter: str) -> None:
        """Record ``adapter`` as the run's best and point ``RUN@best`` at it."""
        self.point_alias(run_alias(run, BEST), adapter)
        with self._write() as conn:
            conn.execute("UPDATE runs SET best = ? WHERE name = ?", (adapter, run))
