"""A Compare chat: a system prompt, the user's turns, and each column's own answers (plain Python).

Every column sees the same user turns; its history holds its own adapter's answers, so a
follow-up asks each adapter about what it said itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multilora_studio.engine import Prompt


@dataclass
class Conversation:
    """The turns so far; ``answers[column]`` has one entry per finished turn of that column."""

    names: list[str]
    system_prompt: str = ""
    raw: bool = False
    user_turns: list[str] = field(default_factory=list)
    answers: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.answers:
            self.answers = [[] for _ in self.names]

    @property
    def turns(self) -> int:
        return len(self.user_turns)

    def ask(self, text: str) -> None:
        """Add the next user turn (every column has answered the previous ones)."""
        if self.raw and self.user_turns:
            raise ValueError("a raw prompt has no turns: untick Raw prompt to chat")
        if any(len(answers) != self.turns for answers in self.answers):
            raise ValueError("wait until every column has answered")
        self.user_turns.append(text)

    def answer(self, column: int, text: str) -> None:
        self.answers[column].append(text)

    def cut(self, turn: int) -> None:
        """Forget user turn ``turn`` (0-based) and everything after it, in every column."""
        if not 0 <= turn < self.turns:
            raise ValueError(f"there is no turn {turn + 1}")
        del self.user_turns[turn:]
        for answers in self.answers:
            del answers[turn:]

    def history(self, column: int) -> list[tuple[str, str]]:
        """Column ``column``'s earlier (user, answer) turns, before the last user turn."""
        return list(zip(self.user_turns[:-1], self.answers[column], strict=False))

    def prompt(self, column: int) -> Prompt:
        """What column ``column`` sends for the last user turn: its own history, then that turn."""
        if self.raw:
            return self.user_turns[-1]
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for turn, text in enumerate(self.user_turns):
            messages.append({"role": "user", "content": text})
            if turn < len(self.answers[column]) and turn < self.turns - 1:
                messages.append({"role": "assistant", "content": self.answers[column][turn]})
        return messages

    @classmethod
    def from_prompts(
        cls, names: list[str], prompts: list[Prompt], raw: bool, user_turns: list[str]
    ) -> Conversation:
        """The chat as it stood when ``prompts`` (one per column, as a record holds them) were sent."""
        conversation = cls(list(names), raw=raw, user_turns=list(user_turns))
        for column, prompt in enumerate(prompts):
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
                if prompt[0].get("role") == "system":
                    conversation.system_prompt = str(prompt[0].get("content", ""))
                conversation.answers[column] = [
                    str(m.get("content", ""))
                    for m in prompt
                    if isinstance(m, dict) and m.get("role") == "assistant"
                ]
        return conversation
