"""The Arena's model: rounds produced in one batched run with one seed, names hidden until the
vote, the next round prepared while the person reads, votes stored and ranked."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from multilora_studio.arena import A, ArenaSettings, B, VoteStore, judge_round, run_round
from multilora_studio.gui.workflows.arena_session import HIDDEN, ArenaSession
from multilora_studio.run_records import BASE, AdapterDigests
from tests.workflows.conftest import ADAPTERS

CONTENDERS = [BASE, ADAPTERS[0], ADAPTERS[1]]


def produce(pool, ask):
    with pool.lease(pool.primary) as engine:
        return run_round(engine, ask.prompt, ask.left, ask.right, session_settings(), AdapterDigests())


def session_settings():
    return ArenaSettings(max_tokens=6, temperature=0.8, chat=False)


def test_a_round_is_two_contenders_in_one_run_with_the_same_recorded_settings(pool):
    with pool.lease(pool.primary) as engine:
        produced = run_round(engine, "Hello", BASE, ADAPTERS[0], session_settings(), AdapterDigests())
        again = run_round(engine, "Hello", ADAPTERS[0], ADAPTERS[0], session_settings(), AdapterDigests())
        base_digest = engine.base_digest
    assert produced.settings["seed"] is not None and produced.settings["max_tokens"] == 6
    assert produced.base_digest == base_digest and produced.digest_left == ""
    assert len(produced.digest_right) == 64 and produced.output_left and produced.output_right
    assert again.output_left == again.output_right  # the same settings and seed on both sides


def test_names_stay_hidden_until_the_vote_and_the_next_round_is_prepared_meanwhile(pool, tmp_path):
    session = ArenaSession(VoteStore(tmp_path), random.Random(0))
    ask = session.start(CONTENDERS, ["Hello", "Name a color"])
    assert session.wanted() is None  # one round at a time
    session.delivered(produce(pool, ask))
    assert session.names() == HIDDEN
    ahead = session.wanted()
    assert ahead is not None and frozenset((ahead.left, ahead.right)) != frozenset((ask.left, ask.right))
    session.delivered(produce(pool, ahead))
    assert session.names() == HIDDEN and session.next_round() is False  # no vote yet
    vote = session.vote(A)
    assert vote is not None and session.names() == (ask.left, ask.right)
    assert session.vote(B) is None  # one vote per round
    assert session.next_round() and session.names() == HIDDEN
    assert session.current is not None and session.current.left == ahead.left
    session.vote(B)
    board = session.board()
    assert board.votes == 2 and sum(s.votes for s in board.standings) == 4
    assert VoteStore(tmp_path).votes() == session.votes


def test_enter_before_the_next_round_is_ready_waits_for_it(pool, tmp_path):
    session = ArenaSession(VoteStore(tmp_path), random.Random(1))
    session.delivered(produce(pool, session.start(CONTENDERS, ["Hi"])))
    session.vote(A)
    assert session.next_round() is False and session.current is None
    ask = session.wanted()
    assert ask is not None
    session.delivered(produce(pool, ask))
    assert session.current is not None and session.names() == HIDDEN


def test_an_arena_needs_prompts_and_two_contenders(tmp_path):
    session = ArenaSession(VoteStore(tmp_path))
    with pytest.raises(ValueError, match="prompt"):
        session.start(CONTENDERS, [])
    with pytest.raises(ValueError, match="two contenders"):
        session.start([BASE], ["Hi"])


def test_a_judges_vote_is_kept_apart_and_shows_only_after_the_persons(pool, tmp_path):
    session = ArenaSession(VoteStore(tmp_path), random.Random(2))
    session.delivered(produce(pool, session.start(CONTENDERS[1:], ["Hi", "Name a color"])))
    shown = session.current
    assert shown is not None and session.judge_text() == ""
    with pool.lease(pool.primary) as engine:
        judged = judge_round(engine, BASE, shown)
    stale = replace(judged, round_id="another round")
    assert session.judged(stale) is False and session.judged(judged) and not session.judged(judged)
    assert "shows after yours" in session.judge_text()
    assert shown.left not in session.judge_text() and shown.right not in session.judge_text()
    session.vote(judged.verdict)
    assert session.judge_text().startswith("judge:base: ") and "agrees with you" in session.judge_text()
    assert session.board().votes == 1  # people's votes only
    assert session.agreements() == ["judge:base agreed with people on 1 of 1 rounds (100%)"]
