"""The leaderboard as text: aligned rows best first, the not yet separable pairs, judges' agreement."""

from __future__ import annotations

import numpy as np

from multilora_studio.arena import A, B, agreement_lines, board_lines, leaderboard
from multilora_studio.arena.table import COLUMNS
from multilora_studio.arena.votes import judge_voter
from tests.arena.votes_fixtures import simulated, vote


def test_the_table_lists_every_contender_best_first_with_its_interval():
    votes = simulated({"strong": 1400, "close-a": 1000, "close-b": 1010}, 30, np.random.default_rng(3))
    lines = board_lines(leaderboard(votes))
    assert lines[0].startswith("30 votes") and lines[2].split() == " ".join(COLUMNS).split()
    assert lines[3].startswith("strong") and " – " in lines[3]
    assert lines[-1].startswith("not yet separable: close-") and "strong ~" not in lines[-1]


def test_no_votes_is_one_line_and_judges_count_rounds_people_voted_on():
    assert board_lines(leaderboard([])) == ["No votes yet."]
    votes = [vote("x", "y", A, 1.0), vote("x", "y", B, 2.0)]
    judge = judge_voter("base")
    judged = [vote("x", "y", A, 1.0, voter=judge), vote("x", "y", A, 3.0, voter=judge)]
    assert agreement_lines(votes + judged) == ["judge:base agreed with people on 1 of 1 rounds (100%)"]
