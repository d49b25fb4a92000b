"""The Bradley-Terry fit recovers known strengths, and its bootstrap intervals cover them."""

from __future__ import annotations

import numpy as np

from multilora_studio.arena import TIE, leaderboard
from multilora_studio.arena.bradley_terry import MEAN
from tests.arena.votes_fixtures import simulated, vote

TRUE = {"base": 900.0, "pirate": 1000.0, "poet": 1050.0, "formal": 1150.0}  # mean 1025


def centred(ratings: dict[str, float]) -> dict[str, float]:
    mean = sum(ratings.values()) / len(ratings)
    return {name: value - mean + MEAN for name, value in ratings.items()}


def test_the_fit_recovers_known_strengths_from_many_votes():
    board = leaderboard(simulated(TRUE, 6000, np.random.default_rng(1)), rounds=20)
    fitted = {s.name: s.rating for s in board.standings}
    for name, rating in centred(TRUE).items():
        assert abs(fitted[name] - rating) < 25, (name, fitted[name], rating)
    assert board.names == ["formal", "poet", "pirate", "base"]
    assert abs(sum(fitted.values()) / len(fitted) - MEAN) < 1e-6


def test_the_95_percent_intervals_cover_the_true_ratings_at_about_that_rate():
    rng = np.random.default_rng(2)
    truth = centred(TRUE)
    covered = total = 0
    for _ in range(40):
        board = leaderboard(simulated(TRUE, 300, rng), rounds=100, seed=int(rng.integers(1 << 30)))
        for s in board.standings:
            covered += s.low <= truth[s.name] <= s.high
            total += 1
    assert 0.88 <= covered / total <= 0.99, covered / total


def test_ties_count_as_half_a_win_each():
    votes = [vote("pirate", "poet", TIE, created=float(i)) for i in range(10)]
    board = leaderboard(votes, rounds=20)
    assert [round(s.rating, 6) for s in board.standings] == [MEAN, MEAN]
    assert [s.win_rate for s in board.standings] == [0.5, 0.5]
    assert not board.separable("pirate", "poet")


def test_an_unbeaten_contender_gets_a_finite_rating_and_stays_finite():
    votes = [vote("pirate", "poet", "a", created=float(i)) for i in range(3)]
    board = leaderboard(votes, rounds=50)
    top, bottom = board.standings
    assert top.name == "pirate" and np.isfinite(top.rating) and top.rating > bottom.rating
    assert (top.wins, top.losses, top.votes) == (3, 0, 3)
    assert board.matrix == ((None, 1.0), (0.0, None))


def test_a_few_mixed_votes_are_not_separable():
    votes = [vote("pirate", "poet", verdict, created=float(i)) for i, verdict in enumerate("aab")]
    board = leaderboard(votes, rounds=100)
    assert board.close_to("pirate") == ["poet"]


def test_clear_differences_are_separable():
    votes = simulated({"weak": 700.0, "strong": 1300.0}, 200, np.random.default_rng(3))
    board = leaderboard(votes, rounds=100)
    assert board.separable("weak", "strong")
    assert board.close_to("strong") == []
