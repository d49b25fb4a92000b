"""A checkpoint's per-prompt scores and which checkpoint of a run is the best.

A prompt's score is 1 or 0 where it has a check (the metric ``pass``), else its reference's mean
log-probability per token (``logprob``); a prompt the metric cannot score is None. A checkpoint
replaces the run's best only when its mean is higher by more than the spread of the difference
over the prompts: the mean of the paired per-prompt differences must exceed ``Z`` standard
errors of that mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from multilora_studio.adapters.registry_runs import CheckpointRecord
from multilora_studio.evaluate import EvalResults

PASS, LOGPROB = "pass", "logprob"
Z = 1.96  # two-sided 95% under a normal approximation


def checkpoint_scores(results: EvalResults, adapter: str) -> tuple[str, list[float | None]]:
    """(metric, one score per prompt) of ``adapter`` in ``results``."""
    cells = [results.cell(index, adapter) for index in range(len(results.prompts))]
    if any(cell.passed is not None for cell in cells):
        return PASS, [None if cell.passed is None else float(cell.passed) for cell in cells]
    return LOGPROB, [
        cell.reference_logprob / cell.reference_tokens
        if cell.reference_logprob is not None and cell.reference_tokens
        else None
        for cell in cells
    ]


def mean_and_error(values: Sequence[float]) -> tuple[float, float]:
    """The mean and its standard error (0 for fewer than two values)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    variance = sum((value - mean) ** 2 for value in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def spread(checkpoint: CheckpointRecord) -> float | None:
    """The standard error of the checkpoint's mean score (None when it is not scored)."""
    values = [value for value in checkpoint.scores or () if value is not None]
    return mean_and_error(values)[1] if values else None


def clearly_better(candidate: CheckpointRecord, incumbent: CheckpointRecord) -> bool:
    """Whether ``candidate``'s scores beat ``incumbent``'s by more than their spread: the mean of
    the per-prompt differences (prompts both scored) above ``Z`` standard errors of it."""
    pairs = [
        (a, b)
        for a, b in zip(candidate.scores or (), incumbent.scores or (), strict=False)
        if a is not None and b is not None
    ]
    if not pairs:
        return False
    mean, error = mean_and_error([a - b for a, b in pairs])
    return mean > Z * error and mean > 0


@dataclass(frozen=True)
class BestPick:
    """The run's best checkpoint, its mean score and the spread (standard error) of that mean."""

    checkpoint: CheckpointRecord
    mean: float
    spread: float


def pick_best(checkpoints: Sequence[CheckpointRecord], current: str | None) -> BestPick | None:
    """The best of the scored checkpoints still in the library (the metric of the newest one):
    the current best (adapter name ``current``) unless the highest mean beats it clearly; None
    when none is scored."""
    scored = [c for c in checkpoints if c.present and c.mean_score is not None]
    if not scored:
        return None
    metric = max(scored, key=lambda c: c.created).metric
    scored = [c for c in scored if c.metric == metric]
    top = max(scored, key=lambda c: (c.mean_score, -c.step, -c.version))
    incumbent = next((c for c in scored if c.adapter == current), None)
    best = top if incumbent is None or clearly_better(top, incumbent) else incumbent
    return BestPick(best, best.mean_score or 0.0, spread(best) or 0.0)
