"""What a training run's output folder holds now: its checkpoints and their training state.

The trainers people use (HF Trainer, TRL, axolotl, Unsloth) write ``checkpoint-N/`` folders, each
with a PEFT adapter (``adapter_config.json`` + ``adapter_model.safetensors``) and
``trainer_state.json``, and the final adapter in the run folder itself. Reading a folder costs one
listing and a few ``stat`` calls per checkpoint; nothing here reads the weights.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from multilora_studio.adapters.adapter_config import CONFIG_FILE, WEIGHTS_FILE, AdapterError
from multilora_studio.adapters.safetensors_header import read_header

CHECKPOINT_FOLDER = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
MAX_STATE_BYTES = 64 << 20
WATCHED_FILES = (CONFIG_FILE, WEIGHTS_FILE, TRAINER_STATE)

# (file name, size, modification time in ns) of each watched file present, in WATCHED_FILES order
Signature = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class FolderSnapshot:
    """One adapter folder of a run as a poll saw it: a checkpoint (``step``) or the final adapter
    in the run folder (``final``; its step comes from its ``trainer_state.json`` when it has one)."""

    path: Path
    step: int | None
    final: bool
    signature: Signature

    @property
    def has_adapter(self) -> bool:
        return {CONFIG_FILE, WEIGHTS_FILE} <= self.files

    @property
    def has_state(self) -> bool:
        return TRAINER_STATE in self.files

    @property
    def files(self) -> set[str]:
        return {name for name, _, _ in self.signature}


@dataclass(frozen=True)
class LossPoint:
    """One logged value of ``trainer_state.json``'s ``log_history``."""

    step: int
    loss: float | None = None
    eval_loss: float | None = None


@dataclass(frozen=True)
class TrainerState:
    """What the run records of itself at a checkpoint."""

    global_step: int
    losses: tuple[LossPoint, ...]


def signature_of(folder: Path) -> Signature:
    """The watched files of ``folder`` with their sizes and times (files missing left out)."""
    entries = []
    for name in WATCHED_FILES:
        try:
            info = os.stat(folder / name)
        except OSError:
            continue
        entries.append((name, info.st_size, info.st_mtime_ns))
    return tuple(entries)


def scan_run(folder: Path) -> list[FolderSnapshot]:
    """The run's checkpoints by step, then its final adapter (if the run folder has one)."""
    found = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        match = CHECKPOINT_FOLDER.match(entry.name)
        if match and entry.is_dir(follow_symlinks=False):
            path = Path(entry.path)
            found.append(FolderSnapshot(path, int(match.group(1)), False, signature_of(path)))
    found.sort(key=lambda snapshot: snapshot.step or 0)
    final = signature_of(folder)
    if {CONFIG_FILE, WEIGHTS_FILE} <= {name for name, _, _ in final}:
        found.append(FolderSnapshot(folder, None, True, final))
    return found


def complete(snapshot: FolderSnapshot) -> bool:
    """Whether the folder holds a whole adapter: both adapter files, a checkpoint's
    ``trainer_state.json`` (the trainer writes it last), a weights file as long as its header says
    and a state file that parses."""
    if not snapshot.has_adapter or (not snapshot.final and not snapshot.has_state):
        return False
    try:
        read_header(snapshot.path / WEIGHTS_FILE)
        json.loads((snapshot.path / CONFIG_FILE).read_text(encoding="utf-8"))
        if snapshot.has_state:
            read_trainer_state(snapshot.path / TRAINER_STATE)
    except (AdapterError, OSError, ValueError):
        return False
    return True


def read_trainer_state(path: Path) -> TrainerState:
    """The global step and the losses of ``log_history``; ValueError for a file that is not one."""
    if path.stat().st_size > MAX_STATE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_STATE_BYTES >> 20} MiB")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("global_step"), int):
        raise ValueError(f"{path} has no global_step")
    points: dict[int, LossPoint] = {}
    for entry in data.get("log_history") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            continue
        step = entry["step"]
        before = points.get(step, LossPoint(step))
        points[step] = LossPoint(
            step,
            number(entry.get("loss"), before.loss),
            number(entry.get("eval_loss"), before.eval_loss),
        )
    return TrainerState(data["global_step"], tuple(points[step] for step in sorted(points)))


def number(value: object, otherwise: float | None) -> float | None:
    """``value`` as a float when it is a number, else ``otherwise``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return otherwise
