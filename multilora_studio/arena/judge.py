"""A model the app serves (the base, or an adapter of it) asked to vote on a round with a
pairwise prompt; its votes are recorded under ``judge:<name>``, apart from people's.

The judge reads both answers in the order shown (A first), answers greedily, and its first
word decides: ``A``, ``B``, ``tie`` or ``both`` (both bad); anything else counts as a tie.
"""

from __future__ import annotations

import threading

from multilora_studio.arena.rounds import Round
from multilora_studio.arena.votes import BOTH_BAD, TIE, A, B, Vote, judge_voter
from multilora_studio.engine import SamplingParams, ServingEngine
from multilora_studio.evaluate.runner import wait_all
from multilora_studio.run_records import BASE

JUDGE_PROMPT = """You compare two answers to the same prompt.

Prompt:
{prompt}

Answer A:
{left}

Answer B:
{right}

Which answer is better? Reply with one word: A, B, tie, or both (if both are bad)."""
JUDGE_TOKENS = 4
WORDS = {"a": A, "b": B, "tie": TIE, "both": BOTH_BAD}


def verdict_of(reply: str) -> str:
    """The verdict in a judge's reply: its first word, a tie when it is none of them."""
    words = reply.strip().split()
    first = words[0].strip(".,:;!\"'()*").lower() if words else ""
    return WORDS.get(first, TIE)


def judge_round(
    engine: ServingEngine, judge: str, done: Round, cancel: threading.Event | None = None
) -> Vote:
    """``judge``'s vote on ``done`` (``'base'``: the base model without an adapter)."""
    text = JUDGE_PROMPT.format(prompt=done.prompt, left=done.output_left, right=done.output_right)
    params = SamplingParams(max_tokens=JUDGE_TOKENS, temperature=0.0)
    request = ([{"role": "user", "content": text}], None if judge == BASE else judge, params)
    (output,) = wait_all(engine, engine.submit_many([request]), cancel, None, 0, 1)
    return done.vote(verdict_of(output.text), judge_voter(judge))
