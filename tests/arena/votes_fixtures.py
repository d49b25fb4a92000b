"""Simulated arena votes: contenders of known strength voting by the Bradley-Terry model."""

from __future__ import annotations

import math

import numpy as np

from multilora_studio.arena import A, B, Vote
from multilora_studio.arena.bradley_terry import SCALE


def vote(left: str, right: str, verdict: str, created: float = 0.0, **extra: object) -> Vote:
    fields: dict = dict(
        round_id=f"r{created}",
        prompt="Say hi.",
        left=left,
        right=right,
        output_left=f"{left} says hi",
        output_right=f"{right} says hi",
        verdict=verdict,
        settings={"max_tokens": 16, "temperature": 0.7, "top_p": 1.0, "chat": True, "seed": 7},
        base_digest="b" * 64,
        digest_left="" if left == "base" else left[0] * 64,
        digest_right="" if right == "base" else right[0] * 64,
        created=created,
    )
    return Vote(**{**fields, **extra})


def simulated(ratings: dict[str, float], count: int, rng: np.random.Generator) -> list[Vote]:
    """``count`` votes between random pairs of ``ratings`` (Elo), drawn from the model."""
    names = list(ratings)
    votes = []
    for index in range(count):
        i, j = rng.choice(len(names), 2, replace=False)
        gap = (ratings[names[i]] - ratings[names[j]]) / SCALE
        verdict = A if rng.random() < 1 / (1 + math.exp(-gap)) else B
        votes.append(vote(names[i], names[j], verdict, created=float(index)))
    return votes
