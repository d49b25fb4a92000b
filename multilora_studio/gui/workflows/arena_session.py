"""The Arena as a plain model: which contenders meet on which prompt, the round shown (names hidden
until the vote), the round prepared while the person reads, a judge's vote on the round shown, the
votes and the leaderboard.

Rounds and judges' votes are produced elsewhere (the view runs ``ArenaSession.wanted()`` and
``judge_round`` through the engine off the GUI thread and hands the result back with
``delivered`` and ``judged``); the session only decides and records. A judge's verdict shows only
after the person's, so that it does not sway it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from multilora_studio.arena import (
    PERSON,
    VERDICT_WORDS,
    Leaderboard,
    Matchmaker,
    Round,
    Vote,
    VoteStore,
    agreement_lines,
    leaderboard,
)
from multilora_studio.engine import Prompt
from multilora_studio.gui.workflows.events import Field, Observable

HIDDEN = ("Model A", "Model B")  # what the two sides are called until the vote
# ``changed`` names: the round shown (or its reveal); the votes (so the leaderboard)
ROUND, VOTES = "round", "votes"


@dataclass(frozen=True)
class Ask:
    """One round to produce: ``prompt`` through ``left`` (shown as A) and ``right``."""

    prompt: Prompt
    left: str
    right: str


class ArenaSession(Observable):
    """One arena over ``contenders`` and ``prompts`` (see the module docstring)."""

    message = Field("")

    def __init__(self, store: VoteStore, rng: random.Random | None = None) -> None:
        super().__init__()
        self.store = store
        self.rng = rng or random.Random()
        self.matchmaker: Matchmaker | None = None
        self.prompts: list[Prompt] = []
        self.prompt_order: list[Prompt] = []
        self.current: Round | None = None
        self.prepared: Round | None = None
        self.asked: Ask | None = None  # being produced now
        self.revealed = False
        self.verdict: str | None = None
        self.judge_vote: Vote | None = None  # on the round shown
        self.votes: list[Vote] = []  # this arena's people's votes

    def start(self, contenders: list[str], prompts: list[Prompt]) -> Ask:
        """Begin an arena; its first round to produce (ValueError: under two contenders, no prompt)."""
        if not prompts:
            raise ValueError("give at least one prompt (type them, one a line, or pick a prompt set)")
        self.matchmaker = Matchmaker(contenders, self.rng)
        self.prompts, self.prompt_order = list(prompts), []
        self.current = self.prepared = self.asked = None
        self.revealed, self.verdict, self.votes, self.judge_vote = False, None, [], None
        self.message = "Preparing the first round…"
        self.changed.emit(ROUND)
        return self._ask()

    @property
    def running(self) -> bool:
        return self.matchmaker is not None

    def wanted(self) -> Ask | None:
        """The next round to produce while the person reads, if one is needed now."""
        if self.matchmaker is None or self.asked is not None or self.prepared is not None:
            return None
        return self._ask()

    def delivered(self, produced: Round) -> None:
        """A produced round: shown at once when none is, else kept for the next."""
        self.asked = None
        if self.current is None:
            self._show(produced)
        else:
            self.prepared = produced

    def failed(self, message: str) -> None:
        self.asked = None
        self.matchmaker = None
        self.message = f"The round failed: {message}"

    def names(self) -> tuple[str, str]:
        """What the sides are called now: hidden until the vote, then the contenders' names."""
        if self.current is None or not self.revealed:
            return HIDDEN
        return self.current.left, self.current.right

    def vote(self, verdict: str) -> Vote | None:
        """Record the person's verdict on the round shown and reveal its names (once per round)."""
        if self.current is None or self.revealed:
            return None
        vote = self.current.vote(verdict, PERSON)
        self.store.add([vote])
        self.votes.append(vote)
        self.revealed, self.verdict = True, verdict
        self.message = "Press Enter for the next round."
        self.changed.emit(ROUND)
        self.changed.emit(VOTES)
        return vote

    def next_round(self) -> bool:
        """Show the prepared round (after a vote); False while it is not ready yet."""
        if not self.revealed:
            return False
        if self.prepared is None:
            self.current = None
            self.message = "Preparing the next round…"
            self.changed.emit(ROUND)
            return False
        produced, self.prepared = self.prepared, None
        self._show(produced)
        return True

    def judged(self, vote: Vote) -> bool:
        """Record a judge's vote on the round shown (False: that round is gone, or judged already)."""
        if self.current is None or vote.round_id != self.current.id or self.judge_vote is not None:
            return False
        self.store.add([vote])
        self.judge_vote = vote
        self.changed.emit(ROUND)
        self.changed.emit(VOTES)
        return True

    def judge_text(self) -> str:
        """The judge's vote on the round shown: hidden until the person's, then with the names."""
        vote = self.judge_vote
        if vote is None:
            return ""
        if not self.revealed:
            return f"{vote.voter} has voted; its verdict shows after yours."
        winner = f" ({vote.winner})" if vote.winner is not None else ""
        agrees = "agrees" if vote.verdict == self.verdict else "disagrees"
        return f"{vote.voter}: {VERDICT_WORDS[vote.verdict]}{winner}; it {agrees} with you."

    def board(self) -> Leaderboard:
        """People's votes on the base of this arena's rounds (every vote when none ran yet)."""
        return leaderboard(self.store.votes(base_digest=self._base(), voter=PERSON))

    def agreements(self) -> list[str]:
        """Each judge's agreement with people on the base of this arena's rounds."""
        return agreement_lines(self.store.votes(base_digest=self._base()))

    def _base(self) -> str | None:
        shown = self.current or (self.votes[-1] if self.votes else None)
        return shown.base_digest if shown is not None else None

    def stop(self) -> None:
        self.matchmaker = None
        self.asked = self.prepared = None

    def _show(self, produced: Round) -> None:
        self.current, self.revealed, self.verdict, self.judge_vote = produced, False, None, None
        self.message = "Which answer is better? 1: A, 2: B, 3: tie, 4: both bad."
        self.changed.emit(ROUND)

    def _ask(self) -> Ask:
        assert self.matchmaker is not None
        if not self.prompt_order:
            self.prompt_order = self.rng.sample(self.prompts, len(self.prompts))
        left, right = self.matchmaker.next(self.votes)
        self.asked = Ask(self.prompt_order.pop(), left, right)
        return self.asked
