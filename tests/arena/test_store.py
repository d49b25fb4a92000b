"""Votes persist in the library's folder and recompute to the same table; votes on an adapter's
old weights are kept apart from its new ones; exports read back to the same votes."""

from __future__ import annotations

import numpy as np
import pytest

from multilora_studio.arena import VoteStore, leaderboard, people, read_export, write_export
from multilora_studio.arena.leaderboard import agreement
from multilora_studio.arena.votes import judge_voter
from tests.arena.votes_fixtures import simulated, vote

TRUE = {"base": 950.0, "pirate": 1000.0, "poet": 1100.0}


def test_votes_survive_a_reopen_and_recompute_to_the_same_table(tmp_path):
    votes = simulated(TRUE, 60, np.random.default_rng(4))
    VoteStore(tmp_path).add(votes)
    again = VoteStore(tmp_path).votes()
    assert again == votes
    assert leaderboard(again, rounds=50) == leaderboard(votes, rounds=50)


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_an_export_reads_back_to_the_same_votes_and_table(tmp_path, suffix):
    votes = simulated(TRUE, 40, np.random.default_rng(5))
    board = leaderboard(votes, rounds=30)
    path = tmp_path / f"arena{suffix}"
    write_export(path, votes, board)
    assert read_export(path) == votes
    assert leaderboard(read_export(path), rounds=30) == board


def test_votes_on_old_weights_are_a_contender_of_their_own(tmp_path):
    old = [vote("pirate", "poet", "a", created=float(i), digest_left="1" * 64) for i in range(3)]
    new = [vote("pirate", "poet", "b", created=10.0 + i, digest_left="2" * 64) for i in range(3)]
    store = VoteStore(tmp_path)
    store.add(old + new)
    board = leaderboard(store.votes(), rounds=20)
    assert sorted(board.names) == ["pirate", "pirate @11111111", "poet"]
    by_name = {s.name: s for s in board.standings}
    assert (by_name["pirate"].wins, by_name["pirate"].losses) == (0, 3)
    assert (by_name["pirate @11111111"].wins, by_name["pirate @11111111"].losses) == (3, 0)


def test_a_judges_votes_are_kept_apart_and_its_agreement_counted(tmp_path):
    judge = judge_voter("base")
    mine = [vote("pirate", "poet", "a", created=float(i)) for i in range(4)]
    its = [vote("pirate", "poet", "a" if i < 3 else "b", created=float(i), voter=judge) for i in range(4)]
    store = VoteStore(tmp_path)
    store.add(mine + its)
    assert store.voters() == [judge, "person"]
    assert people(store.votes()) == mine
    assert store.votes(voter=judge) == its
    assert agreement(store.votes(), judge) == (3, 4)


def test_an_unknown_verdict_is_refused():
    with pytest.raises(ValueError, match="verdict"):
        vote("pirate", "poet", "maybe")
