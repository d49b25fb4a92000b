"""The leaderboard of a set of votes: Bradley-Terry ratings with bootstrap 95 % intervals, win
rates, votes per contender, the pairwise win matrix, which contenders are not yet separable, and
how often a judge agreed with people."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from multilora_studio.arena.bradley_terry import bootstrap_ratings, elo, fit_strengths, pair_counts
from multilora_studio.arena.votes import PERSON, A, B, Vote, contender_keys

BOOTSTRAP_ROUNDS = 200
LEVEL = 0.95
SEED = 0  # the bootstrap's: the same votes always give the same table


@dataclass(frozen=True)
class Standing:
    name: str
    rating: float
    low: float  # the 95 % interval
    high: float
    votes: int
    wins: int
    ties: int  # ties and "both bad"
    losses: int

    @property
    def win_rate(self) -> float:
        """Wins plus half the ties, over votes."""
        return (self.wins + 0.5 * self.ties) / self.votes if self.votes else 0.0


@dataclass(frozen=True)
class Leaderboard:
    """``standings`` best first; ``matrix[i][j]``: what ``standings[i]`` scored against
    ``standings[j]`` as a fraction (None: they never met); ``games[i][j]`` how often they met."""

    standings: tuple[Standing, ...]
    matrix: tuple[tuple[float | None, ...], ...]
    games: tuple[tuple[int, ...], ...]
    inseparable: frozenset[frozenset[str]]
    votes: int

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.standings]

    def separable(self, first: str, second: str) -> bool:
        """Whether the 95 % interval of the two ratings' difference excludes 0."""
        return frozenset((first, second)) not in self.inseparable

    def close_to(self, name: str) -> list[str]:
        """The contenders ``name`` is not yet separable from, best first."""
        return [other for other in self.names if other != name and not self.separable(name, other)]


def leaderboard(votes: list[Vote], rounds: int = BOOTSTRAP_ROUNDS, seed: int = SEED) -> Leaderboard:
    """The table of ``votes`` (people's or one judge's; pass them already filtered)."""
    keys = contender_keys(votes)
    names = sorted({name for pair in keys for name in pair})
    if not names:
        return Leaderboard((), (), (), frozenset(), 0)
    index = {name: position for position, name in enumerate(names)}
    first = np.array([index[left] for left, _ in keys], dtype=np.int64)
    second = np.array([index[right] for _, right in keys], dtype=np.int64)
    score = np.array([vote.score for vote in votes])
    wins, games = pair_counts(first, second, score, len(names))
    ratings = elo(fit_strengths(wins, games))
    samples = bootstrap_ratings(first, second, score, len(names), rounds, np.random.default_rng(seed))
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(samples, [tail, 100 - tail], axis=0)
    inseparable = set()
    for i, name in enumerate(names):
        for j in range(i + 1, len(names)):
            lo, hi = np.percentile(samples[:, i] - samples[:, j], [tail, 100 - tail])
            if lo <= 0 <= hi:
                inseparable.add(frozenset((name, names[j])))
    order = sorted(range(len(names)), key=lambda i: (-ratings[i], names[i]))
    standings = tuple(_standing(names[i], ratings[i], low[i], high[i], keys, votes) for i in order)
    matrix = tuple(
        tuple(float(wins[i, j] / games[i, j]) if games[i, j] else None for j in order) for i in order
    )
    counts = tuple(tuple(int(games[i, j]) for j in order) for i in order)
    return Leaderboard(standings, matrix, counts, frozenset(inseparable), len(votes))


def _standing(
    name: str, rating: float, low: float, high: float, keys: list[tuple[str, str]], votes: list[Vote]
) -> Standing:
    wins = ties = losses = 0
    for (left, right), vote in zip(keys, votes, strict=True):
        if name not in (left, right):
            continue
        if vote.verdict not in (A, B):
            ties += 1
        elif (vote.verdict == A) == (name == left):
            wins += 1
        else:
            losses += 1
    return Standing(name, float(rating), float(low), float(high), wins + ties + losses, wins, ties, losses)


def people(votes: list[Vote]) -> list[Vote]:
    return [vote for vote in votes if vote.voter == PERSON]


def agreement(votes: list[Vote], judge: str) -> tuple[int, int]:
    """(rounds where ``judge`` voted as a person did, rounds both voted on)."""
    by_people = {vote.round_id: vote.verdict for vote in votes if vote.voter == PERSON}
    shared = [vote for vote in votes if vote.voter == judge and vote.round_id in by_people]
    return sum(vote.verdict == by_people[vote.round_id] for vote in shared), len(shared)
