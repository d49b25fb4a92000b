"""Training runs followed as they write checkpoints: imported, served, scored, aliases moved.

Each ``poll`` (from one thread at a time) polls every followed run's folder (``RunWatcher``),
serves each new checkpoint on the engine (when there is one) and then points ``RUN@latest`` at
it, evaluates the checkpoints not yet scored on the run's prompt set in one batched evaluation
(``run_eval``: several checkpoints side by side in the engine's steps), records the scores and
moves ``RUN@best`` when a checkpoint beats the best by more than the spread (``scores``).

An alias moves in the library and in ``aliases`` (a running server's alias table), always after
the adapter it names is on the engine: a request by the alias resolves to that checkpoint's name
when it arrives, so it gets that checkpoint's weights and KV (the prefix cache keys KV by the
adapter's version), never the one the alias named before.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.library_errors import LibraryError
from multilora_studio.adapters.registry import DEFAULT_MAX_RANK, Registry
from multilora_studio.adapters.registry_lifecycle import ACTIVE
from multilora_studio.adapters.registry_runs import BEST, LATEST, CheckpointRecord, run_alias
from multilora_studio.adapters.run_watcher import PollResult, RunWatcher
from multilora_studio.engine import ServingEngine
from multilora_studio.evaluate import (
    EvalSettings,
    PromptSet,
    load_prompt_set,
    run_eval,
    save_results,
)
from multilora_studio.evaluate.library import score_record
from multilora_studio.runs.scores import BestPick, checkpoint_scores, pick_best

log = logging.getLogger(__name__)


class AliasTable(Protocol):
    """Where a running server resolves aliases (``deploy.ModelAliases``)."""

    def set(self, alias: str, adapter: str, warm: Sequence[str] = ()) -> None: ...


@dataclass
class RunUpdate:
    """What one poll did for one run."""

    run: str
    polled: PollResult
    scored: list[str] = field(default_factory=list)  # checkpoints evaluated
    best: BestPick | None = None
    best_moved: bool = False
    error: str | None = None  # why its checkpoints could not be evaluated

    @property
    def changed(self) -> bool:
        return bool(self.polled.imported or self.polled.gone or self.scored or self.best_moved or self.error)


class RunFollower:
    """Follows training runs into one library, on one engine (or none: imported only)."""

    def __init__(
        self,
        registry: Registry,
        base: BaseModelRef,
        *,
        engine: ServingEngine | None = None,
        aliases: AliasTable | None = None,
        settings: EvalSettings | None = None,
        follow_deletions: bool = False,
        imports_per_poll: int = 1,
        evals_per_poll: int = 4,
        results_dir: Path | None = None,
    ) -> None:
        self.registry = registry
        self.base = base
        self.engine = engine
        self.aliases = aliases
        self.settings = settings or EvalSettings(max_tokens=16)
        self.follow_deletions = follow_deletions
        self.imports_per_poll = imports_per_poll
        self.evals_per_poll = evals_per_poll
        self.results_dir = results_dir
        self.max_rank = engine.config.max_lora_rank if engine is not None else DEFAULT_MAX_RANK
        self._watchers: dict[str, RunWatcher] = {}
        self._prompt_sets: dict[str, PromptSet] = {}
        self._broken: dict[str, str] = {}  # run -> why its prompt set cannot be evaluated

    @property
    def runs(self) -> list[str]:
        return list(self._watchers)

    def follow(self, name: str, folder: Path, prompt_set: Path | None = None) -> None:
        """Follow the run ``name`` writing into ``folder`` (or resume it), scored on ``prompt_set``
        (a ValueError for a file that is not a prompt set, before anything is recorded)."""
        if prompt_set is not None:
            loaded = load_prompt_set(prompt_set)
        run = self.registry.follow_run(
            name, folder, "" if prompt_set is None else str(Path(prompt_set).resolve())
        )
        if prompt_set is not None:
            self._prompt_sets[name] = loaded
        self._broken.pop(name, None)
        self._watchers[name] = RunWatcher(
            self.registry,
            run.name,
            self.base,
            max_rank=self.max_rank,
            follow_deletions=self.follow_deletions,
            imports_per_poll=self.imports_per_poll,
        )

    def serve_run(self, name: str, engine: ServingEngine) -> list[str]:
        """Put the run's checkpoints the library serves on ``engine`` (their weights read on first
        use) and its aliases in ``aliases``: what a server started on ``engine`` needs to answer
        for a run imported before it started. The names added."""
        added = []
        for checkpoint in self.registry.checkpoints(name):
            record = self.registry.find(checkpoint.adapter) if checkpoint.present else None
            if record is None or record.state != ACTIVE or engine.has_adapter(record.name):
                continue
            self.registry.load_into(engine, record.name, preload=False)
            added.append(record.name)
        for which in (LATEST, BEST):
            alias = run_alias(name, which)
            target = self.registry.find(alias)
            if target is not None and self.aliases is not None and engine.has_adapter(target.name):
                self.aliases.set(alias, target.name)
        return added

    def resume(self) -> list[str]:
        """Follow again every run the library was following (after a restart); their names."""
        resumed = []
        for run in self.registry.runs():
            if run.watching and run.name not in self._watchers:
                prompt_set = Path(run.prompt_set) if run.prompt_set else None
                try:
                    self.follow(run.name, run.folder, prompt_set)
                except (ValueError, OSError) as error:  # its prompt set moved or changed: imports only
                    log.warning("run %s: its prompt set cannot be read (%s); not scored", run.name, error)
                    self.follow(run.name, run.folder)
                    self._broken[run.name] = str(error)
                resumed.append(run.name)
        return resumed

    def scores(self, name: str) -> bool:
        """Whether the run's checkpoints are scored: an engine, a prompt set, and no error."""
        return self.engine is not None and name in self._prompt_sets and name not in self._broken

    def stop(self, name: str) -> None:
        """Stop following ``name`` (its checkpoints stay in the library)."""
        self._watchers.pop(name, None)
        self.registry.stop_watching(name)

    def poll(self) -> list[RunUpdate]:
        """One poll of every run (see the module docstring); a run stopped meanwhile (from
        another thread) is left out."""
        return [self.poll_run(name, watcher) for name, watcher in list(self._watchers.items())]

    def poll_run(self, name: str, watcher: RunWatcher) -> RunUpdate:
        update = RunUpdate(name, watcher.poll())
        for checkpoint in update.polled.imported:
            try:
                self._point(name, LATEST, checkpoint.adapter)
            except LibraryError as error:  # removed or refused meanwhile: the next one moves it
                log.warning("run %s: %s", name, error)
        if self.engine is not None and self.scores(name):
            try:
                update.scored = self._evaluate(name, self.engine)
            except (ValueError, RuntimeError, LibraryError) as error:
                self._broken[name] = str(error)
                log.warning("run %s: checkpoints not evaluated: %s", name, error)
        update.error = self._broken.get(name)
        run = self.registry.run(name)
        update.best = pick_best(self.registry.checkpoints(name), run.best)
        if update.best is not None and update.best.checkpoint.adapter != run.best:
            self._point(name, BEST, update.best.checkpoint.adapter)
            update.best_moved = True
        return update

    def _point(self, run: str, which: str, adapter: str) -> None:
        """Serve ``adapter`` (when there is an engine), then point the run's alias at it."""
        alias = run_alias(run, which)
        if self.engine is not None and not self.engine.has_adapter(adapter):
            self.registry.load_into(self.engine, adapter, preload=False)
        if which == BEST:
            self.registry.set_run_best(run, adapter)
        else:
            self.registry.point_alias(alias, adapter)
        if self.aliases is not None:
            self.aliases.set(alias, adapter)

    def scoring_key(self, run: str) -> str:
        """What a checkpoint's scores depend on: the run's prompt set (its digest) and the
        evaluation settings; scores made with another key are made again."""
        settings = json.dumps(dataclasses.asdict(self.settings), sort_keys=True)
        return f"{self._prompt_sets[run].digest} {settings}"

    def _evaluate(self, run: str, engine: ServingEngine) -> list[str]:
        """Score up to ``evals_per_poll`` checkpoints not yet scored on the run's prompt set with
        the current settings (new ones, and earlier ones scored otherwise), in one evaluation."""
        key = self.scoring_key(run)
        pending = [c for c in self.registry.checkpoints(run) if c.scored_with != key and c.present]
        chosen: list[CheckpointRecord] = []
        for checkpoint in pending:
            record = self.registry.find(checkpoint.adapter)
            if record is None or record.state != ACTIVE:
                continue
            if not engine.has_adapter(record.name):
                self.registry.load_into(engine, record.name)
            chosen.append(checkpoint)
            if len(chosen) == self.evals_per_poll:
                break
        if not chosen:
            return []
        names = [c.adapter for c in chosen]
        results = run_eval(engine, self._prompt_sets[run], names, self.settings)
        saved = save_results(results, self.results_dir)
        for checkpoint in chosen:
            metric, scores = checkpoint_scores(results, checkpoint.adapter)
            self.registry.record_checkpoint_scores(
                checkpoint.id, metric, scores, score_record(results, checkpoint.adapter, saved), key
            )
        return names
