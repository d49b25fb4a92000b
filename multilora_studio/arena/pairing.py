"""Which two contenders meet next, and on which sides.

A pair's cost is ``min(votes of either) + games between them / 2 + |rating gap| / CLOSE``: pairs
with a contender that has few votes come first, then pairs that met rarely, then pairs with close
ratings (where a vote teaches the most). The cheapest pair wins, ties at random; the pair of the
round before is never taken again while any other exists. The side rule balances each contender's
sides: of the two, the one with the lower balance (times shown as A minus times shown as B) goes
left, a coin deciding equal balances.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from multilora_studio.arena.bradley_terry import elo, fit_strengths, pair_counts
from multilora_studio.arena.votes import Vote

CLOSE = 100.0  # Elo points that weigh as much as one vote


def next_pair(
    names: Sequence[str],
    votes: Mapping[str, int],
    games: Mapping[frozenset[str], int],
    ratings: Mapping[str, float],
    last: frozenset[str] | None,
    rng: random.Random,
) -> tuple[str, str]:
    """The next pair of ``names`` (unordered; ``sides`` orders it)."""
    pairs = [frozenset(pair) for pair in itertools.combinations(dict.fromkeys(names), 2)]
    if not pairs:
        raise ValueError("the arena needs at least two contenders")
    fresh = [pair for pair in pairs if pair != last] or pairs

    def cost(pair: frozenset[str]) -> float:
        first, second = sorted(pair)
        gap = abs(ratings.get(first, 0.0) - ratings.get(second, 0.0))
        return min(votes.get(first, 0), votes.get(second, 0)) + games.get(pair, 0) / 2 + gap / CLOSE

    best = min(cost(pair) for pair in fresh)
    first, second = sorted(rng.choice([pair for pair in fresh if cost(pair) <= best + 1e-9]))
    return first, second


def sides(pair: tuple[str, str], balance: Mapping[str, int], rng: random.Random) -> tuple[str, str]:
    """(A, B) of ``pair``: the lower ``balance`` (times A minus times B) goes left."""
    first, second = pair
    if balance.get(first, 0) == balance.get(second, 0):
        return (first, second) if rng.random() < 0.5 else (second, first)
    return (first, second) if balance.get(first, 0) < balance.get(second, 0) else (second, first)


class Matchmaker:
    """The pairs of one arena: ``next`` picks a pair for ``votes`` so far and orders its sides."""

    def __init__(self, names: Sequence[str], rng: random.Random | None = None) -> None:
        self.names = list(dict.fromkeys(names))
        if len(self.names) < 2:
            raise ValueError("the arena needs at least two contenders")
        self.rng = rng or random.Random()
        self.last: frozenset[str] | None = None
        self.balance: Counter[str] = Counter()

    def next(self, votes: Sequence[Vote]) -> tuple[str, str]:
        """(A, B) of the next round, given the votes on this arena's contenders so far."""
        counts: Counter[str] = Counter()
        games: Counter[frozenset[str]] = Counter()
        for vote in votes:
            counts.update((vote.left, vote.right))
            games[frozenset((vote.left, vote.right))] += 1
        pair = next_pair(self.names, counts, games, quick_ratings(self.names, votes), self.last, self.rng)
        left, right = sides(pair, self.balance, self.rng)
        self.last = frozenset(pair)
        self.balance[left] += 1
        self.balance[right] -= 1
        return left, right


def quick_ratings(names: Sequence[str], votes: Sequence[Vote]) -> dict[str, float]:
    """Elo ratings of ``names`` from the votes between them (no intervals)."""
    index = {name: position for position, name in enumerate(names)}
    kept = [v for v in votes if v.left in index and v.right in index]
    if not kept:
        return {}
    first = np.array([index[v.left] for v in kept], dtype=np.int64)
    second = np.array([index[v.right] for v in kept], dtype=np.int64)
    wins, games = pair_counts(first, second, np.array([v.score for v in kept]), len(names))
    return dict(zip(names, (float(r) for r in elo(fit_strengths(wins, games))), strict=True))
