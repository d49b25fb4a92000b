"""The blind arena over adapters (no Qt): rounds of two hidden answers to one prompt produced in
one batched run, pairwise votes stored in the library, and a Bradley-Terry leaderboard."""

from multilora_studio.arena.export import read_export, write_export
from multilora_studio.arena.judge import judge_round
from multilora_studio.arena.leaderboard import Leaderboard, Standing, agreement, leaderboard, people
from multilora_studio.arena.pairing import Matchmaker
from multilora_studio.arena.rounds import (
    ArenaSettings,
    Round,
    check_contenders,
    prompt_set_prompts,
    run_round,
    typed_prompts,
)
from multilora_studio.arena.store import VoteStore
from multilora_studio.arena.table import agreement_lines, board_lines
from multilora_studio.arena.votes import BOTH_BAD, PERSON, TIE, VERDICT_WORDS, VERDICTS, A, B, Vote

__all__ = [
    "BOTH_BAD",
    "PERSON",
    "TIE",
    "VERDICTS",
    "VERDICT_WORDS",
    "A",
    "ArenaSettings",
    "B",
    "Leaderboard",
    "Matchmaker",
    "Round",
    "Standing",
    "Vote",
    "VoteStore",
    "agreement",
    "agreement_lines",
    "board_lines",
    "check_contenders",
    "judge_round",
    "leaderboard",
    "people",
    "prompt_set_prompts",
    "read_export",
    "run_round",
    "typed_prompts",
    "write_export",
]
