"""Follow one training run's folder by polling: import each checkpoint once it is complete.

A checkpoint is imported when its watched files (``run_folder.WATCHED_FILES``) are the same on
two polls in a row and whole (``run_folder.complete``), as ``RUN@step-N`` through
``Registry.import_folder`` (validated against the base like any import). What was imported is
in the library (``registry_runs``), so a watcher made after a restart resumes where the last one
stopped. The same step seen again (a run restarted from a checkpoint) is not imported twice when
its weights are the same; other weights become the step's next version (``RUN@step-N.v2``). A
folder the trainer deletes (``save_total_limit``) leaves the library's copy, marked gone (and
retired with ``follow_deletions``). Each poll imports at most ``imports_per_poll`` checkpoints,
so a slow disk or a long backlog never makes one poll long.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from multilora_studio.adapters.adapter_config import WEIGHTS_FILE, AdapterError
from multilora_studio.adapters.base_model import BaseModelRef
from multilora_studio.adapters.library_errors import LibraryError
from multilora_studio.adapters.registry import DEFAULT_MAX_RANK, Registry
from multilora_studio.adapters.registry_lifecycle import ACTIVE
from multilora_studio.adapters.registry_runs import CheckpointRecord, checkpoint_name
from multilora_studio.adapters.run_folder import (
    TRAINER_STATE,
    FolderSnapshot,
    LossPoint,
    Signature,
    TrainerState,
    complete,
    read_trainer_state,
    scan_run,
)
from multilora_studio.util import sha256_file

log = logging.getLogger(__name__)


@dataclass
class PollResult:
    """What one poll did: checkpoints imported (in step order), folders found deleted, folders
    refused (with why; not tried again until their files change) and folders still being written."""

    imported: list[CheckpointRecord] = field(default_factory=list)
    gone: list[CheckpointRecord] = field(default_factory=list)
    refused: list[tuple[Path, str]] = field(default_factory=list)
    waiting: int = 0


class RunWatcher:
    """Polls one run's folder (``poll``, from one thread at a time)."""

    def __init__(
        self,
        registry: Registry,
        run: str,
        base: BaseModelRef,
        *,
        max_rank: int = DEFAULT_MAX_RANK,
        follow_deletions: bool = False,
        imports_per_poll: int = 1,
    ) -> None:
        if imports_per_poll < 1:
            raise ValueError("imports_per_poll must be at least 1")
        self.registry = registry
        self.run = registry.run(run)
        self.base = base
        self.max_rank = max_rank
        self.follow_deletions = follow_deletions
        self.imports_per_poll = imports_per_poll
        self._last_seen: dict[Path, Signature] = {}  # each folder's files at the previous poll
        self._settled: dict[Path, Signature] = {}  # files already handled without a new import

    def poll(self) -> PollResult:
        result = PollResult()
        snapshots = scan_run(self.run.folder)
        known = self.registry.checkpoints(self.run.name)
        self._note_deletions(known, {s.path for s in snapshots}, result)
        ready = []
        for snapshot in snapshots:
            if self._handled(snapshot, known):
                continue
            if self._last_seen.get(snapshot.path) == snapshot.signature and complete(snapshot):
                ready.append(snapshot)
            else:
                result.waiting += 1
        self._last_seen = {s.path: s.signature for s in snapshots}
        for snapshot in ready[: self.imports_per_poll]:
            try:
                imported = self._take(snapshot, known)
            except (LibraryError, AdapterError, OSError, ValueError) as error:
                if snapshot.path.exists():
                    self._settled[snapshot.path] = snapshot.signature
                    result.refused.append((snapshot.path, str(error)))
                    log.warning("run %s: %s not imported: %s", self.run.name, snapshot.path, error)
                continue
            if imported is not None:
                result.imported.append(imported)
                known.append(imported)
        result.waiting += max(0, len(ready) - self.imports_per_poll)
        return result

    def _handled(self, snapshot: FolderSnapshot, known: list[CheckpointRecord]) -> bool:
        if self._settled.get(snapshot.path) == snapshot.signature:
            return True
        return any(c.folder == snapshot.path and c.signature == snapshot.signature for c in known)

    def _note_deletions(self, known: list[CheckpointRecord], present: set[Path], result: PollResult) -> None:
        for checkpoint in known:
            if checkpoint.gone or checkpoint.folder in present:
                continue
            self.registry.checkpoint_gone(checkpoint.id)
            result.gone.append(checkpoint)
            log.info(
                "run %s: %s was deleted; the library keeps %s",
                self.run.name,
                checkpoint.folder,
                checkpoint.adapter,
            )
            if self.follow_deletions and checkpoint.present:
                record = self.registry.find(checkpoint.adapter)
                if record is not None and record.state == ACTIVE:
                    self.registry.retire(checkpoint.adapter, f"its folder {checkpoint.folder} was deleted")

    def _take(self, snapshot: FolderSnapshot, known: list[CheckpointRecord]) -> CheckpointRecord | None:
        """Import ``snapshot`` unless a checkpoint already has its weights (then None)."""
        state = read_trainer_state(snapshot.path / TRAINER_STATE) if snapshot.has_state else None
        step = self._step_of(snapshot, state, known)
        digest = sha256_file(snapshot.path / WEIGHTS_FILE)
        # the final adapter may be any checkpoint's weights (load_best_model_at_end), a checkpoint
        # folder only its own step's (a restarted run writing that step again)
        same = [c for c in known if c.weights_sha256 == digest and (snapshot.final or c.step == step)]
        if same:
            if snapshot.final:
                self._settled[snapshot.path] = snapshot.signature
            else:
                self.registry.checkpoint_seen(same[-1].id, snapshot.path, snapshot.signature)
            return None
        name = self._import(snapshot, step, digest)
        if state is not None:
            self.registry.set_run_losses(self.run.name, state.losses)
        checkpoint = self.registry.add_checkpoint(
            self.run.name, step, name, snapshot.path, snapshot.signature, digest, loss_at(state, step)
        )
        log.info("run %s: imported %s as %s", self.run.name, snapshot.path, name)
        return checkpoint

    def _import(self, snapshot: FolderSnapshot, step: int, digest: str) -> str:
        """The name ``snapshot`` is in the library under: a new import, or the copy an interrupted
        import left (same weights, no checkpoint row yet)."""
        version = self.registry.next_checkpoint_version(self.run.name, step)
        while True:
            name = checkpoint_name(self.run.name, step, version)
            existing = self.registry.find(name)
            if existing is None:
                break
            if sha256_file(existing.path / WEIGHTS_FILE) == digest:
                return name
            version += 1
        self.registry.import_folder(
            snapshot.path,
            self.base,
            name=name,
            max_rank=self.max_rank,
            notes=f"training run {self.run.name}, step {step}",
        )
        return name

    @staticmethod
    def _step_of(snapshot: FolderSnapshot, state: TrainerState | None, known: list[CheckpointRecord]) -> int:
        """A checkpoint's step; the final adapter's from its state, else the last step seen."""
        if snapshot.step is not None:
            return snapshot.step
        if state is not None:
            return state.global_step
        return max((c.step for c in known), default=0)


def loss_at(state: TrainerState | None, step: int) -> LossPoint | None:
    """The last training and evaluation losses logged at or before ``step``."""
    if state is None:
        return None
    loss = eval_loss = None
    for point in state.losses:
        if point.step > step:
            break
        loss = point.loss if point.loss is not None else loss
        eval_loss = point.eval_loss if point.eval_loss is not None else eval_loss
    return LossPoint(step, loss, eval_loss)
