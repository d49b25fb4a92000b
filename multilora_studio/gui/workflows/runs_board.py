"""The Runs view's state as plain rules: the runs, the picked run's checkpoints and curves, which
checkpoint a click on the curve means, what Compare opens on and what the clean-up actions touch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from multilora_studio.adapters.registry_runs import CheckpointRecord, RunRecord
from multilora_studio.run_records import BASE
from multilora_studio.runs.scores import BestPick, spread


@dataclass(frozen=True)
class Curves:
    """What the plot shows: score per scored step (with its spread), losses per logged step."""

    score_steps: list[float]
    scores: list[float]
    spreads: list[float]
    loss_steps: list[float]
    losses: list[float]
    eval_loss_steps: list[float]
    eval_losses: list[float]
    metric: str | None


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint as the table lists it."""

    step: str
    adapter: str
    loss: str
    eval_loss: str
    score: str
    note: str


class RunsBoard:
    """The runs and the picked run (``pick``), refreshed from the library (``show``)."""

    def __init__(self) -> None:
        self.runs: list[RunRecord] = []
        self.picked: str | None = None
        self.checkpoints: list[CheckpointRecord] = []

    def show(self, runs: Sequence[RunRecord], checkpoints: Sequence[CheckpointRecord]) -> None:
        """The library's runs and the picked run's checkpoints (the picked run kept if it is listed,
        else the first)."""
        self.runs = list(runs)
        names = [run.name for run in self.runs]
        if self.picked not in names:
            self.picked = names[0] if names else None
        self.checkpoints = [c for c in checkpoints if c.run == self.picked]

    def pick(self, name: str | None) -> None:
        self.picked = name if name in [run.name for run in self.runs] else None
        self.checkpoints = []

    @property
    def run(self) -> RunRecord | None:
        return next((run for run in self.runs if run.name == self.picked), None)

    @property
    def best(self) -> BestPick | None:
        """The checkpoint ``RUN@best`` names, with its mean score and spread."""
        run = self.run
        found = next((c for c in self.checkpoints if run is not None and c.adapter == run.best), None)
        if found is None or found.mean_score is None:
            return None
        return BestPick(found, found.mean_score, spread(found) or 0.0)

    @property
    def latest(self) -> CheckpointRecord | None:
        present = [c for c in self.checkpoints if c.present]
        return max(present, key=lambda c: c.created) if present else None

    def curves(self) -> Curves:
        run = self.run
        scored = [c for c in self.checkpoints if c.present and c.mean_score is not None]
        metric = scored[-1].metric if scored else None
        scored = [c for c in scored if c.metric == metric]
        losses = run.losses if run is not None else ()
        return Curves(
            score_steps=[float(c.step) for c in scored],
            scores=[c.mean_score or 0.0 for c in scored],
            spreads=[spread(c) or 0.0 for c in scored],
            loss_steps=[float(p.step) for p in losses if p.loss is not None],
            losses=[p.loss for p in losses if p.loss is not None],
            eval_loss_steps=[float(p.step) for p in losses if p.eval_loss is not None],
            eval_losses=[p.eval_loss for p in losses if p.eval_loss is not None],
            metric=metric,
        )

    def rows(self) -> list[CheckpointRow]:
        best, latest = self.best, self.latest
        rows = []
        for c in self.checkpoints:
            notes = [
                word
                for word, holds in (
                    ("best", best is not None and best.checkpoint.id == c.id),
                    ("latest", latest is not None and latest.id == c.id),
                    ("folder deleted", c.gone),
                    ("removed from the library", not c.present),
                )
                if holds
            ]
            error = spread(c)
            mean = c.mean_score
            rows.append(
                CheckpointRow(
                    step=str(c.step) if c.version == 1 else f"{c.step} (v{c.version})",
                    adapter=c.adapter,
                    loss=number(c.train_loss),
                    eval_loss=number(c.eval_loss),
                    score="" if mean is None else f"{mean:.4f} ± {error or 0.0:.4f}",
                    note=", ".join(notes),
                )
            )
        return rows

    def checkpoint_near(self, step: float) -> CheckpointRecord | None:
        """The checkpoint still in the library closest to ``step`` (a click on the curve)."""
        present = [c for c in self.checkpoints if c.present]
        if not present:
            return None
        return min(present, key=lambda c: (abs(c.step - step), -c.version))

    def compare_columns(self, clicked: CheckpointRecord | None = None) -> list[str]:
        """The base, the best and the latest checkpoint (and a clicked one), each once."""
        best, latest = self.best, self.latest
        names = [BASE]
        for checkpoint in (best.checkpoint if best is not None else None, latest, clicked):
            if checkpoint is not None and checkpoint.adapter not in names:
                names.append(checkpoint.adapter)
        return names

    def others_than_best(self) -> list[str]:
        """The run's checkpoints in the library other than the best (what *Keep the best* retires)."""
        best = self.best
        keep = best.checkpoint.adapter if best is not None else None
        return [c.adapter for c in self.checkpoints if c.present and c.adapter != keep]

    def summary(self) -> str:
        """One line on the picked run: its checkpoints, the best with its spread, the latest."""
        run, best, latest = self.run, self.best, self.latest
        if run is None:
            return "No training run yet: Watch a folder to follow one."
        watched = "" if run.watching else " (not watched)"
        parts = [f"{run.name}: {len(self.checkpoints)} checkpoints{watched}"]
        if best is not None:
            score = f"{best.checkpoint.metric} {best.mean:.4f} ± {best.spread:.4f}"
            parts.append(f"best {best.checkpoint.adapter} ({score})")
        if latest is not None:
            parts.append(f"latest {latest.adapter}")
        if not run.prompt_set:
            parts.append("no prompt set: checkpoints are not scored")
        return "; ".join(parts)


def number(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"
