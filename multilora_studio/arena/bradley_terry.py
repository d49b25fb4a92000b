"""Bradley-Terry ratings of contenders from pairwise comparisons, on an Elo scale.

Model: P(i beats j) = 1 / (1 + exp(-(t_i - t_j))). A tie (and a "both bad" vote) counts as half a
win for each side. The fit is Newton's method on the log-likelihood with a small ridge term
(``RIDGE``), so a contender that never lost (or never won) still gets a finite rating. Ratings are
shown as ``MEAN + SCALE * t`` with ``SCALE = 400 / ln 10`` (a 400-point gap is 10:1 odds) and the
contenders' mean at ``MEAN``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

SCALE = 400.0 / math.log(10.0)
MEAN = 1000.0
RIDGE = 1e-2  # per contender: a prior worth a hundredth of a game at even odds, keeps ratings finite
TOLERANCE = 1e-9
MAX_STEPS = 100


def pair_counts(
    first: NDArray[np.int64], second: NDArray[np.int64], score: NDArray[np.float64], count: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(wins[i, j]: what i scored against j, games[i, j]: games between them) of ``count``
    contenders; ``score`` is 1 for a win of ``first``, 0 for a loss, 0.5 for a tie."""
    wins = np.zeros((count, count))
    games = np.zeros((count, count))
    np.add.at(wins, (first, second), score)
    np.add.at(wins, (second, first), 1.0 - score)
    np.add.at(games, (first, second), 1.0)
    np.add.at(games, (second, first), 1.0)
    return wins, games


def fit_strengths(
    wins: NDArray[np.float64], games: NDArray[np.float64], start: NDArray[np.float64] | None = None
) -> NDArray[np.float64]:
    """The strengths t (mean 0, natural-log odds) that maximise the ridge-penalised likelihood."""
    count = wins.shape[0]
    theta = np.zeros(count) if start is None else start.copy()
    scored = wins.sum(axis=1)
    for _ in range(MAX_STEPS):
        p = 1.0 / (1.0 + np.exp(theta[None, :] - theta[:, None]))  # [i, j]: P(i beats j)
        gradient = scored - (games * p).sum(axis=1) - RIDGE * theta
        curvature = games * p * (1.0 - p)
        hessian = curvature - np.diag(curvature.sum(axis=1) + RIDGE)
        step = np.linalg.solve(hessian, gradient)
        theta = theta - step
        if np.max(np.abs(step)) < TOLERANCE:
            break
    return theta - theta.mean()


def elo(strengths: NDArray[np.float64]) -> NDArray[np.float64]:
    """Strengths on the Elo scale (mean ``MEAN``)."""
    return MEAN + SCALE * (strengths - strengths.mean())


def bootstrap_ratings(
    first: NDArray[np.int64],
    second: NDArray[np.int64],
    score: NDArray[np.float64],
    count: int,
    rounds: int,
    rng: np.random.Generator,
) -> NDArray[np.float64]:
    """Elo ratings refitted on ``rounds`` resamples of the comparisons: [rounds, count]."""
    wins, games = pair_counts(first, second, score, count)
    start = fit_strengths(wins, games)
    samples = np.empty((rounds, count))
    size = len(first)
    for index in range(rounds):
        picked = rng.integers(0, size, size)
        wins, games = pair_counts(first[picked], second[picked], score[picked], count)
        samples[index] = elo(fit_strengths(wins, games, start))
    return samples
