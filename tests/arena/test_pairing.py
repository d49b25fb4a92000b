"""Pairs chosen to learn fast, never the same pair twice in a row, and balanced sides."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from multilora_studio.arena import Matchmaker
from multilora_studio.arena.pairing import next_pair
from tests.arena.votes_fixtures import vote

NAMES = ["base", "pirate", "poet", "formal"]


def test_a_contender_with_few_votes_is_picked_first():
    votes = {"base": 9, "pirate": 9, "poet": 9, "formal": 1}
    for seed in range(20):
        pair = next_pair(NAMES, votes, {}, {}, None, random.Random(seed))
        assert "formal" in pair


def test_close_ratings_come_before_far_ones():
    ratings = {"base": 800.0, "pirate": 1000.0, "poet": 1010.0, "formal": 1200.0}
    votes = dict.fromkeys(NAMES, 10)
    assert next_pair(NAMES, votes, {}, ratings, None, random.Random(0)) == ("pirate", "poet")


def test_never_the_same_pair_twice_in_a_row():
    ratings = {"base": 800.0, "pirate": 1000.0, "poet": 1010.0, "formal": 1200.0}
    votes = dict.fromkeys(NAMES, 10)
    last = frozenset(("pirate", "poet"))
    assert frozenset(next_pair(NAMES, votes, {}, ratings, last, random.Random(0))) != last
    maker = Matchmaker(NAMES, random.Random(1))
    history: list = []
    pairs = []
    for index in range(200):
        left, right = maker.next(history)
        pairs.append(frozenset((left, right)))
        history.append(vote(left, right, "a" if index % 3 else "tie", created=float(index)))
    assert all(a != b for a, b in itertools.pairwise(pairs))
    assert set(pairs) == {frozenset(p) for p in [(a, b) for a in NAMES for b in NAMES if a < b]}


def test_two_contenders_meet_every_round():
    maker = Matchmaker(["pirate", "poet"], random.Random(0))
    assert {frozenset(maker.next([])) for _ in range(5)} == {frozenset(("pirate", "poet"))}


def test_sides_are_balanced():
    maker = Matchmaker(NAMES, random.Random(3))
    history: list = []
    shown = Counter()
    for index in range(400):
        left, right = maker.next(history)
        shown[left, "A"] += 1
        shown[right, "B"] += 1
        history.append(vote(left, right, random.Random(index).choice("ab"), created=float(index)))
    for name in NAMES:
        assert abs(shown[name, "A"] - shown[name, "B"]) <= 1, (name, shown)


def test_one_contender_is_refused():
    with pytest.raises(ValueError, match="two contenders"):
        Matchmaker(["pirate"])
