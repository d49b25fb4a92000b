"""One vote of the arena: which of two hidden answers to one prompt was better, with everything
needed to recompute it (outputs, sampling settings, base and adapter digests)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

A, B, TIE, BOTH_BAD = "a", "b", "tie", "both_bad"
VERDICTS = (A, B, TIE, BOTH_BAD)  # keys 1, 2, 3, 4
VERDICT_WORDS = {A: "A is better", B: "B is better", TIE: "Tie", BOTH_BAD: "Both bad"}
PERSON = "person"  # a judge's votes are recorded as "judge:<model>"
JUDGE_PREFIX = "judge:"
WEIGHTS_MARK = " @"  # "demo-pirate @1a2b3c4d": the adapter's votes from before its weights changed


def judge_voter(model: str) -> str:
    return f"{JUDGE_PREFIX}{model}"


@dataclass(frozen=True)
class Vote:
    """``left`` was shown as A, ``right`` as B; ``round_id`` ties a judge's vote to the person's
    vote on the same answers."""

    round_id: str
    prompt: str
    left: str
    right: str
    output_left: str
    output_right: str
    verdict: str
    settings: dict[str, Any]
    base_digest: str
    digest_left: str
    digest_right: str
    voter: str = PERSON
    created: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"a verdict is one of {', '.join(VERDICTS)}, got {self.verdict!r}")
        if self.left == self.right:
            raise ValueError(f"a vote compares two contenders, got {self.left!r} twice")

    @property
    def score(self) -> float:
        """What ``left`` scored: 1 win, 0 loss, 0.5 for a tie or both bad."""
        return {A: 1.0, B: 0.0}.get(self.verdict, 0.5)

    @property
    def winner(self) -> str | None:
        return {A: self.left, B: self.right}.get(self.verdict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Vote:
        return cls(**data)


def contender_keys(votes: list[Vote]) -> list[tuple[str, str]]:
    """(left, right) of each vote as leaderboard names: an adapter's votes on weights it no
    longer has (any digest but the newest voted on) are a contender of their own,
    ``name @digest``."""
    newest: dict[str, tuple[float, str]] = {}
    for vote in votes:
        for name, digest in ((vote.left, vote.digest_left), (vote.right, vote.digest_right)):
            if name not in newest or vote.created >= newest[name][0]:
                newest[name] = (vote.created, digest)

    def key(name: str, digest: str) -> str:
        return name if not digest or digest == newest[name][1] else f"{name}{WEIGHTS_MARK}{digest[:8]}"

    return [(key(v.left, v.digest_left), key(v.right, v.digest_right)) for v in votes]
